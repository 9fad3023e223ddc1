"""One completion request's walk: auth → checks → reserve → upstream → relay → settle. Its
steps live beside it: admission (sizing, reserving, overflow and fail-over: gateway/admission.py),
the stream's body (gateway/stream_body.py), settlement (gateway/settlement.py).

Every path that reserved settles exactly once, including refusals by the upstream, upstream
failures, and clients that hang up mid-stream (settling then runs in a task of its own, outside the
cancelled response).
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from tokenyard.backends.base import (
    BackendUnavailable,
    Upstream,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    context_exceeded,
)
from tokenyard.backends.registry import Backends
from tokenyard.core.errors import GatewayError
from tokenyard.core.safety import Safety
from tokenyard.core.settings import Settings
from tokenyard.core.usage import Pricer, Usage, UsageEvent
from tokenyard.gateway import access_log, metrics, refusals, request_ids
from tokenyard.gateway.admission import Admission
from tokenyard.gateway.auth import Authenticator, authorization_of
from tokenyard.gateway.dispatch import Dispatch, Saturation
from tokenyard.gateway.isolation import cache_salt
from tokenyard.gateway.quotas import LeaseKeeper, Quotas, Reservation
from tokenyard.gateway.response_cache import (
    Lookup,
    Mode,
    Recording,
    Replay,
    ResponseCache,
    mode_of,
)
from tokenyard.gateway.screening import (
    CONTENT_FILTER,
    InputCheck,
    blocked_error,
    filter_reply,
    input_text,
    scrub,
)
from tokenyard.gateway.settlement import Settlement, usage_of
from tokenyard.gateway.sizing import PromptOverhead
from tokenyard.gateway.stream_body import Settling, StreamBody
from tokenyard.gateway.streaming import SSE_HEADERS, reply_decoder
from tokenyard.gateway.tracing import NO_TRACE, RequestTrace, Tracing
from tokenyard.gateway.unmasking import Unmasker
from tokenyard.gateway.validation import GENERATING, Kind, Parsed, client_request_id, parse
from tokenyard.router.policy import NoRoute, Route, Router, Unsupported, prefix_text
from tokenyard.tenancy.limits import TIERS
from tokenyard.tenancy.policy import TeamPolicy

RESPONSES_PATH = "/v1/responses"
PATHS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",
}


# Returns when whoever waits for a non-streamed reply hangs up: an HTTP client disconnecting, or
# the batch worker yielding a request to interactive traffic
HangUp = Callable[[], Awaitable[None]]


T = TypeVar("T")


async def _ready(reply: T) -> T:
    """A reply (or stream) already in hand, awaited where an upstream call would be."""
    return reply


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


@dataclass
class _Call:
    """A request before it is addressed to a model: the body is encoded per attempt, with the
    model that attempt goes to."""

    kind: Kind
    body: dict[str, Any]  # without the output cap, which each model names its own way
    headers: dict[str, str]
    max_tokens: int
    # a Responses API request as OpenAI takes it: OpenAI's models get it as is (their own
    # /v1/responses), every other model `body`, its translation onto chat
    responses: dict[str, Any] | None = None
    salt: str | None = None  # the engine's prefix-cache salt (gateway/isolation.py)

    def to(self, upstream: Upstream) -> UpstreamCall:
        info = upstream.info
        if self.responses is not None and info.provider == "openai":
            native = {**self.responses, "model": info.name, "max_output_tokens": self.max_tokens}
            encoded = msgspec.json.encode(native)
            return UpstreamCall(RESPONSES_PATH, encoded, self.headers, prefix_text(self.body))
        body = {**self.body, "model": info.name}
        if self.kind in GENERATING:  # an embedding or a ranking generates nothing: no output cap
            body[info.max_tokens_param] = self.max_tokens
        if self.salt is not None and info.provider == "self-hosted":
            body["cache_salt"] = self.salt
        encoded = msgspec.json.encode(body)
        return UpstreamCall(PATHS[self.kind], encoded, self.headers, prefix_text(body))


def _unmasker(check: InputCheck | None) -> Unmasker | None:
    """What puts the prompt's masked personal data back in the reply (None: nothing masked)."""
    masked = check.screen.masked if check is not None else None
    return Unmasker(masked) if masked else None


class ContextExceeded(Exception):
    """The upstream refused the prompt as too long for its window (the gateway's estimate said it
    fitted) before anything reached the client: the route's context fallbacks may take it."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__("context window exceeded")
        self.status, self.body = status, body


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

    async def handle(
        self,
        request: Request,
        kind: Kind,
        body: bytes | None = None,
        responses: dict[str, Any] | None = None,
    ) -> Response:
        """An HTTP request's walk. `body`: one the gateway built in place of the request's own
        (the Responses API's translation onto chat), walked the same way; `responses`: the
        Responses API request itself, for OpenAI's models (`_Call.responses`)."""
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
                "chat" if kind in GENERATING else kind,
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
        body.pop("max_tokens", None)  # the cap goes in per model (_Call.to)
        if parsed.stream:  # the gateway settles from the usage chunk, so always ask for it
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        call = _Call(
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
            if self.safety is not None and kind in GENERATING:
                screen = await self.safety.screen(
                    policy.team, request_id, parsed.model, parsed.end_user
                )
                if screen is not None:  # personal data masked before anything is sent
                    await scrub(screen, body, responses)
                check = None if screen is None else InputCheck(screen, input_text(parsed.body))
            if lookup is not None:
                await self.cache.find(lookup)
            return await self._forward(
                hang_up, route, upstream, call, parsed, res, event, headers, started, check, lookup
            )
        except BaseException as exc:
            # a no-op if the response already settled (or its stream body owns settling); a task
            # of its own because a cancelled request would cancel an await here as well
            status = exc.status if isinstance(exc, GatewayError) else 500
            served = self.backends.get(event.model_served) or upstream
            model = served.info.name
            self.spawn(self.settlement.settle(res, model, Usage(), event, started, status=status))
            raise

    async def _complete_unless_gone(
        self, hang_up: HangUp, upstream: Upstream, call: UpstreamCall
    ) -> UpstreamReply:
        """The upstream's whole reply, unless the client hangs up first: then the upstream call is
        dropped at once, so the engine frees the sequence instead of finishing it for nobody."""
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            await hang_up()
            task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            return await upstream.complete(call)
        except asyncio.CancelledError:
            if not (watcher.done() and not watcher.cancelled()):
                raise  # cancelled from elsewhere
            task.uncancel()
            raise GatewayError(499, "the client closed the request", code="client_closed") from None
        finally:
            watcher.cancel()

    async def _forward(
        self,
        hang_up: HangUp,
        route: Route,
        upstream: Upstream,
        call: "_Call",
        parsed: Parsed,
        res: Reservation,
        event: UsageEvent,
        headers: dict[str, str],
        started: float,
        check: "InputCheck | None" = None,
        lookup: Lookup | None = None,
    ) -> Response:
        """Send the request to `upstream`; while a backend fails before its first byte, try the
        route's next usable candidate (nothing has reached the client yet). Where the upstream
        refuses the prompt as too long for its window, the route's context fallbacks take it;
        with none usable, the upstream's refusal is the answer."""
        index = route.candidates.index(upstream.info.name)
        while True:
            event.model_served = headers["x-tokenyard-model"] = upstream.info.name
            if parsed.dropped:  # truncation "auto" dropped the oldest turns for this model
                headers["x-tokenyard-truncated"] = str(parsed.dropped)
            res.trace.begin_upstream(upstream.info.name, parsed.stream)
            try:
                return await self._send(
                    hang_up,
                    upstream,
                    call.to(upstream),
                    parsed,
                    res,
                    event,
                    headers,
                    started,
                    check,
                    lookup,
                    widen=bool(route.wider),
                )
            except (BackendUnavailable, ContextExceeded) as exc:
                widening = isinstance(exc, ContextExceeded)
                if widening:
                    metrics.OVERFLOWS.labels(upstream.info.name, "context_window").inc()
                    route, index = route.widened(), -1
                found = await self.admission.fail_over(
                    route, res, parsed, call.max_tokens, event.tier, index + 1
                )
                if found is None and widening:
                    return await self._refused(
                        res, upstream, event, started, exc.status, exc.body, headers
                    )
                if found is None:
                    raise
                metrics.FALLBACKS.labels(upstream.info.name, found[1].info.name).inc()
                index, upstream, call.max_tokens = found

    async def _send(
        self,
        hang_up: HangUp,
        upstream: Upstream,
        call: UpstreamCall,
        parsed: Parsed,
        res: Reservation,
        event: UsageEvent,
        headers: dict[str, str],
        started: float,
        check: "InputCheck | None" = None,
        lookup: Lookup | None = None,
        widen: bool = False,
    ) -> Response:
        """One upstream's answer. `widen`: the route has context fallbacks, so a refusal that says
        the prompt is too long for this model's window raises ContextExceeded instead."""
        hit = lookup.entry if lookup is not None else None
        if lookup is not None:
            headers["x-tokenyard-cache"] = lookup.header
        if hit is not None:  # the same request's answer again: no upstream call, no charge
            event.model_served = headers["x-tokenyard-model"] = hit.model
            event.cache_hit = True
        if not parsed.stream:
            if hit is not None:
                source = _ready(UpstreamReply(200, hit.body, hit.content_type))
            else:
                source = self._complete_unless_gone(hang_up, upstream, call)
            reply = await self._screened(
                check, source, res, upstream, event, started, charge=hit is None
            )
            res.trace.end_upstream(reply.status)
            if widen and context_exceeded(reply.status, reply.body):
                raise ContextExceeded(reply.status, reply.body)
            body = reply.body
            if check is not None and reply.status == 200:  # the output check, on the whole reply
                filtered = filter_reply(body, check.screen.watch_output)
                if filtered is not None:
                    body = filtered
                    headers["x-tokenyard-guard"] = "output-blocked"
            got = None
            if reply.status == 200:
                with contextlib.suppress(msgspec.DecodeError):
                    got = reply_decoder.decode(reply.body)
            usage = Usage()  # a cached answer: nothing was used upstream
            if got is not None and hit is None:
                usage = usage_of(got.usage, event.prompt_reserved, 0)
                event.timings = got.timings
            event.finish_reason = got.finish_reason if got else None
            if body is not reply.body:
                event.finish_reason = CONTENT_FILTER
            elif hit is None and lookup is not None and reply.status == 200:
                await self.cache.keep(lookup, upstream.info.name, reply)
            await self.settlement.settle(
                res, upstream.info.name, usage, event, started, status=reply.status
            )
            if (unmask := _unmasker(check)) is not None and reply.status == 200:
                body = unmask.reply(body)
            return Response(
                body,
                status_code=reply.status,
                media_type=reply.content_type,
                headers=headers,
            )
        opening = upstream.open_stream(call) if hit is None else _ready(Replay(hit.body))
        stream: UpstreamStream = await self._screened(check, opening, res, upstream, event, started)
        if stream.status != 200:
            res.trace.end_upstream(stream.status)
            refusal = await stream.read_all()
            if widen and context_exceeded(stream.status, refusal):
                raise ContextExceeded(stream.status, refusal)
            return await self._refused(
                res, upstream, event, started, stream.status, refusal, headers
            )
        # from here on the body settles, however the stream ends
        watch = check.screen.watch_output() if check is not None else None
        body_iter = StreamBody(self.settling, stream, parsed, res, upstream, event, started, watch)
        body_iter.unmask = _unmasker(check)
        if lookup is not None and hit is None:  # its events are kept if it ends whole
            body_iter.stream = body_iter.recording = Recording(stream, self.cache.max_bytes, lookup)
        return Stream(body_iter, media_type="text/event-stream", headers={**headers, **SSE_HEADERS})

    async def _refused(
        self,
        res: Reservation,
        upstream: Upstream,
        event: UsageEvent,
        started: float,
        status: int,
        body: bytes,
        headers: dict[str, str],
    ) -> Response:
        """An upstream's refusal (a JSON error) as the answer, settled with nothing used."""
        await self.settlement.settle(
            res, upstream.info.name, Usage(), event, started, status=status
        )
        return Response(body, status_code=status, media_type="application/json", headers=headers)

    async def _screened(
        self,
        check: "InputCheck | None",
        call: Any,
        res: Reservation,
        upstream: Upstream,
        event: UsageEvent,
        started: float,
        charge: bool = True,
    ) -> Any:
        """Await the upstream `call` (a whole reply, or a stream opening), the input verdict in
        parallel: the call starts first, the prompt is classified while the upstream works, and
        nothing is returned (so nothing reaches the client) before the verdict. A blocked prompt
        cancels the call and refuses with 400 content_policy_violation; the team is charged only
        what the upstream reported (a reply that was already whole; `charge` False: a cached
        one, nothing), else nothing."""
        if check is None:
            return await call
        task = asyncio.ensure_future(call)
        await asyncio.sleep(0)  # the upstream call starts: its request goes out first
        try:
            verdict = await check.verdict()
        except BaseException:
            task.cancel()
            raise
        if not verdict.blocked:
            return await task
        task.cancel()
        usage = Usage()
        await asyncio.wait({task})  # done already, or cancelled now
        got = None if task.cancelled() or task.exception() else task.result()
        if isinstance(got, UpstreamReply):
            if got.status == 200 and charge:
                with contextlib.suppress(msgspec.DecodeError):
                    reported = reply_decoder.decode(got.body).usage
                    usage = usage_of(reported, event.prompt_reserved, 0)
        elif got is not None:  # a stream that opened: nothing read from it, nothing to charge
            await got.aclose()
        event.finish_reason = CONTENT_FILTER
        event.error = "content_policy_violation"
        await self.settlement.settle(res, upstream.info.name, usage, event, started, status=400)
        raise blocked_error(verdict)

    def spawn(self, coro: Any) -> "asyncio.Task[Any]":
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # a strong reference until it is done
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """On shutdown: let pending settles finish."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
