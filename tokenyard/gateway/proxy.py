"""One completion request's walk: auth → checks → route → reserve → upstream → relay → settle.
Its steps live beside it: admission (sizing, reserving, overflow and fail-over:
gateway/admission.py), the exchange with the route's upstreams (gateway/exchange.py), the
stream's body (gateway/stream_body.py), settlement (gateway/settlement.py).

Every path that reserved settles exactly once, including refusals by the upstream, upstream
failures, and clients that hang up mid-stream (settling then runs in a task of its own, outside the
cancelled response).
"""

import asyncio
import time
from typing import Any

from litestar import Request, Response

from tokenyard.backends.base import (
    Upstream,
)
from tokenyard.backends.registry import Backends
from tokenyard.core.errors import GatewayError
from tokenyard.core.safety import Safety
from tokenyard.core.settings import Settings
from tokenyard.core.usage import Pricer, Usage, UsageEvent
from tokenyard.gateway import access_log, metrics, refusals, request_ids
from tokenyard.gateway.admission import Admission
from tokenyard.gateway.audio import read_form
from tokenyard.gateway.auth import Authenticator, authorization_of
from tokenyard.gateway.dispatch import Dispatch, Saturation
from tokenyard.gateway.exchange import Call, Exchange, HangUp, Pending
from tokenyard.gateway.isolation import cache_salt
from tokenyard.gateway.quotas import LeaseKeeper, Quotas
from tokenyard.gateway.response_cache import (
    Mode,
    ResponseCache,
    mode_of,
)
from tokenyard.gateway.screening import (
    InputCheck,
    input_text,
    scrub,
)
from tokenyard.gateway.settlement import Settlement
from tokenyard.gateway.sizing import PromptOverhead
from tokenyard.gateway.stream_body import Settling
from tokenyard.gateway.tracing import NO_TRACE, RequestTrace, Tracing
from tokenyard.gateway.validation import (
    GENERATING,
    SCREENED,
    UPLOADED,
    Kind,
    Parsed,
    client_request_id,
    parse,
    served_by,
)
from tokenyard.router.policy import NoRoute, Route, Router, Unsupported
from tokenyard.tenancy.limits import TIERS
from tokenyard.tenancy.policy import TeamPolicy


def disconnect_of(request: Request) -> HangUp:
    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return gone


def tier_of(headers: Any, asked: str | None, policy: TeamPolicy) -> str:
    """A request's tier: its headers', else its body's (`asked`), else its team's default."""
    tier = headers.get("x-tier") or headers.get("x-priority") or asked
    if tier is None:
        return policy.default_tier
    if tier not in TIERS:
        raise GatewayError(400, f"tier must be one of {', '.join(TIERS)}", param="tier")
    return tier


def refuse_blocked(policy: TeamPolicy, parsed: Parsed) -> None:
    """403 for an end user the team has blocked (tenancy/end_users.py)."""
    if parsed.end_user is not None and parsed.end_user in policy.blocked_users:
        raise GatewayError(
            403,
            f"end user {parsed.end_user!r} is blocked by team {policy.team!r}",
            code="end_user_blocked",
            param="safety_identifier" if "safety_identifier" in parsed.body else "user",
        )


def _decision(route: Route) -> str:
    """How the route was chosen: direct (a named model), or auto's weak / strong class."""
    if route.score is None:
        return "direct"
    return "strong" if route.escalated else "weak"


class Proxy:
    def __init__(
        self,
        settings: Settings,
        auth: Authenticator,
        quotas: Quotas,
        backends: Backends,
        router: Router,
        price: Pricer,
        safety: Safety | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.tracing = tracing or Tracing()  # off unless tokenyard/app.py hands one in
        self.settings = settings
        self.safety = safety  # the safety layer (guard/), handed in by tokenyard/app.py
        self.auth = auth
        self.quotas = quotas
        self.backends = backends
        self.router = router
        self.dispatch = Dispatch(
            backends,
            Saturation(settings.gateway_max_upstream_waiting, settings.router_max_kv_usage),
        )
        self.keeper = LeaseKeeper(quotas, settings.gateway_lease_s)
        self.overhead = PromptOverhead()
        self.settlement = Settlement(quotas, self.keeper, price, self.overhead)
        self.cache = ResponseCache(
            quotas.redis, settings.gateway_cache_ttl_s, settings.gateway_cache_max_bytes
        )
        self.admission = Admission(settings, quotas, self.dispatch, router.catalog, self.overhead)
        self._tasks: set[asyncio.Task[None]] = set()
        self.settling = Settling(self.settlement, self.cache, self.spawn)
        self.exchange = Exchange(self.admission, self.settlement, self.cache, self.settling)

    async def handle(
        self,
        request: Request,
        kind: Kind,
        body: bytes | None = None,
        responses: dict[str, Any] | None = None,
    ) -> Response:
        """An HTTP request's walk. `body`: one the gateway built in place of the request's own
        (the Responses API's translation onto chat), walked the same way; `responses`: the
        Responses API request itself, for OpenAI's models (`exchange.Call.responses`)."""
        trace = self.tracing.begin(request_ids.request_id(request.scope), kind)
        try:
            return await self._handle(request, kind, body, responses, trace)
        except BaseException as exc:
            trace.refused(exc.status if isinstance(exc, GatewayError) else 500)
            if not isinstance(exc, GatewayError):
                raise
            reason = exc.limit or exc.code  # the limit's own name, also where OpenAI's code differs
            if exc.status in (429, 503) and reason:
                metrics.REFUSALS.labels(reason).inc()
            if exc.status == 429 and reason:  # the admin UI's "429s in the last hour"
                self.spawn(refusals.record(self.quotas.redis, reason))
            raise

    async def _handle(
        self,
        request: Request,
        kind: Kind,
        body: bytes | None,
        responses: dict[str, Any] | None,
        trace: RequestTrace,
    ) -> Response:
        started = time.perf_counter()
        authorization = authorization_of(request.headers)
        with trace.span("auth"):
            policy = await self.auth.authenticate(authorization, path=request.scope["path"])
        trace.root.set_attribute("tokenyard.team", policy.team)
        if body is None and kind in UPLOADED:
            parsed = await read_form(request, kind)
        else:
            parsed = parse(await request.body() if body is None else body, kind)
        tier = tier_of(request.headers, parsed.tier, policy)
        # the id is always the gateway's own: unique, so billing (idempotent by it), the engine
        # and the logs can trust it; the client's id for the request is kept beside it
        for header in ("x-client-request-id", "x-request-id"):
            if (value := request.headers.get(header)) is not None:
                parsed.client_request_id = client_request_id(value, header)
                break
        return await self._serve(
            request,
            disconnect_of(request),
            kind,
            policy,
            parsed,
            tier,
            request_ids.request_id(request.scope),
            started,
            responses,
            trace,
            mode_of(request.headers.get("cache-control")),
        )

    async def run_detached(
        self,
        policy: TeamPolicy,
        kind: Kind,
        body: bytes,
        request_id: str,
        hang_up: HangUp,
        tier: str = "batch",
        responses: dict[str, Any] | None = None,
    ) -> tuple[int, bytes, str]:
        """A non-streamed request no HTTP caller waits on (the batch worker's, a background
        response's): its status, body and the catalog model that served it (`open_detached`)."""
        parsed = parse(body, kind)
        if parsed.stream:
            raise GatewayError(400, "batch requests cannot stream", param="stream")
        response = await self.open_detached(
            policy, kind, parsed, request_id, hang_up, tier, responses
        )
        served = response.headers.get("x-tokenyard-model") or parsed.model
        return response.status_code, response.content, served

    async def open_detached(
        self,
        policy: TeamPolicy,
        kind: Kind,
        parsed: Parsed,
        request_id: str,
        hang_up: HangUp,
        tier: str,
        responses: dict[str, Any] | None = None,
    ) -> Response:
        """A request no HTTP caller waits on: already authenticated, through the same routing,
        quotas and settling as an HTTP one; streamed, its body is the stream, which settles when
        it ends or is closed. `responses`: as in `handle`. Refusals raise GatewayError as they do
        for HTTP callers; a caller that hangs up (`hang_up` returns) while the upstream has not
        replied yet gets a 499 (client_closed), as an HTTP client would."""
        started = time.perf_counter()
        trace = self.tracing.begin(request_id, kind)
        trace.root.set_attribute("tokenyard.team", policy.team)
        try:
            return await self._serve(
                None, hang_up, kind, policy, parsed, tier, request_id, started, responses, trace
            )
        except BaseException as exc:
            trace.refused(exc.status if isinstance(exc, GatewayError) else 500)
            raise

    def pick(
        self, kind: Kind, policy: TeamPolicy, parsed: Parsed, tier: str
    ) -> tuple[Route, Upstream]:
        """The request's route and the first of its upstreams to try; a model the team may not
        use, or one that cannot honour the request, is refused before any quota is touched. An
        alias is the model it stands for from here on (allow-lists, limits, usage records)."""
        parsed.model = self.router.catalog.resolve(parsed.model)
        try:
            route = self.router.route(
                parsed.model,
                parsed.body,
                policy,
                tier,
                served_by(kind),
                prompt_tokens=max(parsed.prompt_sizes, default=0),
            )
        except NoRoute as exc:
            raise GatewayError(404, str(exc), code="model_not_found", param="model") from None
        except Unsupported as exc:
            found = exc.refusal
            raise GatewayError(400, found.message, code=found.code, param=found.param) from None
        return route, self.dispatch.first_usable(route, tier)

    async def _serve(
        self,
        request: Request | None,
        hang_up: HangUp,
        kind: Kind,
        policy: TeamPolicy,
        parsed: Parsed,
        tier: str,
        request_id: str,
        started: float,
        responses: dict[str, Any] | None = None,
        trace: RequestTrace = NO_TRACE,
        cache_mode: Mode = "use",
    ) -> Response:
        """Route, reserve, forward. `request`: the HTTP request (None for the batch worker);
        `hang_up`: how the caller of a non-streamed request says it is gone."""
        refuse_blocked(policy, parsed)
        salt = None
        if kind in GENERATING:
            asked = parsed.body.get("cache_salt")
            salt = cache_salt(self.settings.gateway_prefix_cache_scope, policy.team, asked)
        # a Responses API request answered natively by OpenAI is not a chat reply: never cached.
        # A client's cache_salt is part of the key: its answers stay apart as its prompts do
        lookup = None
        if responses is None:
            lookup = self.cache.lookup(kind, policy, parsed, cache_mode)
        if kind in GENERATING:  # the gateway's own field: never sent on as the client wrote it
            parsed.body.pop("cache_salt", None)
        with trace.span("route", **{"tokenyard.model": parsed.model}) as span:
            route, upstream = self.pick(kind, policy, parsed, tier)
            span.set_attribute("tokenyard.route.decision", _decision(route))
            span.set_attribute("tokenyard.route.candidates", list(route.candidates))
            span.set_attribute("tokenyard.route.served", upstream.info.name)
            if route.score is not None:
                span.set_attribute("tokenyard.route.score", route.score)
        admitted = await self.admission.reserve(route, upstream, policy, parsed, tier, trace)
        res, route, upstream = admitted.res, admitted.route, admitted.upstream
        lease_id = res.lease_id
        body = parsed.body
        body.pop("max_tokens", None)  # the cap goes in per model (Call.to)
        if parsed.stream and kind in GENERATING:  # settled from the usage chunk: always asked
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        call = Call(
            kind,
            body,
            {
                "content-type": "application/json",
                "x-tenant": policy.team,
                "x-priority": tier,
                "x-request-id": request_id,
            },
            admitted.max_tokens,
            responses,
            salt,
            policy.deployment_tags,
            parsed.prompt_tokens + admitted.max_tokens * parsed.choices,
            upload=parsed.upload,
        )
        res.trace, trace.settling = trace, True
        self.keeper.active[lease_id] = res
        metrics.IN_FLIGHT.inc()
        headers = {"x-request-id": request_id, "x-tokenyard-route": _decision(route), **res.headers}
        if parsed.client_request_id is not None:
            headers["x-client-request-id"] = parsed.client_request_id
        if route.score is not None:
            headers["x-tokenyard-score"] = f"{route.score:.4f}"
        if route.confidence is not None:
            headers["x-tokenyard-route-confidence"] = f"{route.confidence:.3f}"
            metrics.ROUTE_CONFIDENCE.observe(route.confidence)
        if route.predicted_quality is not None:
            headers["x-tokenyard-predicted-quality"] = f"{route.predicted_quality:.3f}"
        metrics.ROUTES.labels(route.asked, _decision(route)).inc()
        event = UsageEvent(
            request_id=request_id,
            client_request_id=parsed.client_request_id,
            end_user=parsed.end_user,
            metadata=parsed.metadata,
            team=policy.team,
            model=parsed.model,
            model_served=upstream.info.name,
            tier=tier,
            stream=parsed.stream,
            # the overhead is learned from single prompts only
            prompt_estimate=parsed.prompt_tokens if len(admitted.prompts) == 1 else None,
            prompt_reserved=sum(admitted.prompts),
            ts=time.time(),
            key_prefix=policy.key_prefix,  # the authenticated key's (a batch job's creator's)
            route_features=route.features,
        )
        if request is not None:
            access_log.attach_usage(request.scope, event)
        try:
            check = None
            if self.safety is not None and kind in SCREENED:
                screen = await self.safety.screen(
                    policy.team, request_id, parsed.model, parsed.end_user
                )
                if screen is not None:  # personal data masked before anything is sent
                    await scrub(screen, body, responses)
                text = input_text(parsed.body)
                # an image or speech is paid for once begun: its text is checked before the call
                first = kind not in GENERATING
                check = None if screen is None else InputCheck(screen, text, first)
            if lookup is not None:
                await self.cache.find(lookup)
            pending = Pending(hang_up, parsed, res, event, headers, started, check, lookup)
            return await self.exchange.forward(pending, route, upstream, call)
        except BaseException as exc:
            # a no-op if the response already settled (or its stream body owns settling); a task
            # of its own because a cancelled request would cancel an await here as well
            status = exc.status if isinstance(exc, GatewayError) else 500
            served = self.backends.get(event.model_served) or upstream
            model = served.info.name
            self.spawn(self.settlement.settle(res, model, Usage(), event, started, status=status))
            raise

    def spawn(self, coro: Any) -> "asyncio.Task[Any]":
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a strong reference until it is done
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """On shutdown: let pending settles finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
