"""A request's exchange with the upstreams of its route, once it is admitted: each attempt's
body addressed to its model (`Call`), the fail-over while a backend fails before its first byte,
a move to the route's context fallbacks when an upstream finds the prompt too long for its window,
the input check racing the upstream call, and the answer, whole or streamed, settled (a stream by
its body, gateway/stream_body.py). Nothing reaches the client before the upstream's first byte
and the input verdict, so every move here is invisible to it.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Response
from litestar.response import Stream

from tokenyard.backends.base import (
    BackendUnavailable,
    Upload,
    Upstream,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    context_exceeded,
)
from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import Usage, UsageEvent
from tokenyard.gateway import metrics
from tokenyard.gateway.admission import Admission
from tokenyard.gateway.quotas import Reservation
from tokenyard.gateway.response_cache import Lookup, Recording, Replay, ResponseCache
from tokenyard.gateway.screening import CONTENT_FILTER, InputCheck, blocked_error, filter_reply
from tokenyard.gateway.settlement import Settlement, reply_usage, usage_of
from tokenyard.gateway.stream_body import BytesBody, Settling, StreamBody
from tokenyard.gateway.streaming import SSE_HEADERS, reply_decoder
from tokenyard.gateway.unmasking import Unmasker
from tokenyard.gateway.validation import GENERATING, Kind, Parsed
from tokenyard.router.policy import Route, prefix_text

RESPONSES_PATH = "/v1/responses"
PATHS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",
    "image": "/v1/images/generations",
    "transcription": "/v1/audio/transcriptions",
    "translation": "/v1/audio/translations",
    "speech": "/v1/audio/speech",
}


# Returns when whoever waits for a non-streamed reply hangs up: an HTTP client disconnecting, or
# the batch worker yielding a request to interactive traffic
HangUp = Callable[[], Awaitable[None]]


T = TypeVar("T")


async def _ready(reply: T) -> T:
    """A reply (or stream) already in hand, awaited where an upstream call would be."""
    return reply


@dataclass
class Call:
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
    tags: frozenset[str] = frozenset()  # the team's deployment_tags
    tokens: int = 0  # the prompt's estimate and the output cap: a deployment's tpm counts them
    upload: Upload | None = None  # a form's file, sent with the body's fields (gateway/audio.py)

    def to(self, upstream: Upstream) -> UpstreamCall:
        info = upstream.info
        if self.responses is not None and info.provider == "openai":
            native = {**self.responses, "model": info.name, "max_output_tokens": self.max_tokens}
            encoded = msgspec.json.encode(native)
            prefix = prefix_text(self.body)
            return UpstreamCall(
                RESPONSES_PATH, encoded, self.headers, prefix, self.tags, self.tokens
            )
        body = {**self.body, "model": info.name}
        if self.kind in GENERATING:  # an embedding or a ranking generates nothing: no output cap
            body[info.max_tokens_param] = self.max_tokens
        if self.salt is not None and info.provider == "self-hosted":
            body["cache_salt"] = self.salt
        encoded = msgspec.json.encode(body)
        prefix = prefix_text(body)
        return UpstreamCall(
            PATHS[self.kind], encoded, self.headers, prefix, self.tags, self.tokens, self.upload
        )


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


async def complete_unless_gone(
    hang_up: HangUp, upstream: Upstream, call: UpstreamCall
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


@dataclass
class Pending:
    """A request on its way, as each attempt at it sees it: who waits for it (`hang_up`), what it
    asked, its reservation and usage record, the response's headers, when it started, the input
    check racing the upstream call, and its response-cache lookup."""

    hang_up: HangUp
    parsed: Parsed
    res: Reservation
    event: UsageEvent
    headers: dict[str, str]
    started: float
    check: InputCheck | None = None
    lookup: Lookup | None = None


class Exchange:
    def __init__(
        self,
        admission: Admission,
        settlement: Settlement,
        cache: ResponseCache,
        settling: Settling,
    ) -> None:
        self.admission = admission
        self.settlement = settlement
        self.cache = cache
        self.settling = settling

    async def forward(self, p: Pending, route: Route, upstream: Upstream, call: Call) -> Response:
        """Send the request to `upstream`; while a backend fails before its first byte, try the
        route's next usable candidate (nothing has reached the client yet). Where the upstream
        refuses the prompt as too long for its window, the route's context fallbacks take it;
        with none usable, the upstream's refusal is the answer."""
        index = route.candidates.index(upstream.info.name)
        while True:
            p.event.model_served = p.headers["x-tokenyard-model"] = upstream.info.name
            if p.parsed.dropped:  # truncation "auto" dropped the oldest turns for this model
                p.headers["x-tokenyard-truncated"] = str(p.parsed.dropped)
            p.res.trace.begin_upstream(upstream.info.name, p.parsed.stream)
            try:
                return await self._send(p, upstream, call.to(upstream), widen=bool(route.wider))
            except (BackendUnavailable, ContextExceeded) as exc:
                widening = isinstance(exc, ContextExceeded)
                if widening:
                    metrics.OVERFLOWS.labels(upstream.info.name, "context_window").inc()
                    route, index = route.widened(), -1
                found = await self.admission.fail_over(
                    route, p.res, p.parsed, call.max_tokens, p.event.tier, index + 1
                )
                if found is None and widening:
                    return await self._refused(p, upstream, exc.status, exc.body)
                if found is None:
                    raise
                metrics.FALLBACKS.labels(upstream.info.name, found[1].info.name).inc()
                index, upstream, call.max_tokens = found

    async def _send(
        self, p: Pending, upstream: Upstream, call: UpstreamCall, widen: bool = False
    ) -> Response:
        """One upstream's answer. `widen`: the route has context fallbacks, so a refusal that says
        the prompt is too long for this model's window raises ContextExceeded instead."""
        res, event, headers, check, lookup = p.res, p.event, p.headers, p.check, p.lookup
        hit = lookup.entry if lookup is not None else None
        if lookup is not None:
            headers["x-tokenyard-cache"] = lookup.header
        if hit is not None:  # the same request's answer again: no upstream call, no charge
            event.model_served = headers["x-tokenyard-model"] = hit.model
            event.cache_hit = True
        if not p.parsed.stream and not p.parsed.relayed:
            if hit is not None:
                source = _ready(UpstreamReply(200, hit.body, hit.content_type))
            else:
                source = complete_unless_gone(p.hang_up, upstream, call)
            reply = await self._screened(p, source, upstream, charge=hit is None)
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
            usage = Usage()  # a cached answer, or a refusal: nothing was used upstream
            if hit is None and reply.status == 200:
                usage = reply_usage(got, event.prompt_reserved, p.parsed.metered)
                event.timings = got.timings if got is not None else None
            event.finish_reason = got.finish_reason if got else None
            if body is not reply.body:
                event.finish_reason = CONTENT_FILTER
            elif hit is None and lookup is not None and reply.status == 200:
                await self.cache.keep(lookup, upstream.info.name, reply)
            await self.settlement.settle(
                res, upstream.info.name, usage, event, p.started, status=reply.status
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
        stream: UpstreamStream = await self._screened(p, opening, upstream)
        if stream.status != 200:
            res.trace.end_upstream(stream.status)
            refusal = await stream.read_all()
            if widen and context_exceeded(stream.status, refusal):
                raise ContextExceeded(stream.status, refusal)
            return await self._refused(p, upstream, stream.status, refusal)
        # from here on the body settles, however the stream ends
        if p.parsed.relayed:
            audio = BytesBody(self.settling, stream, p.parsed, res, upstream, event, p.started)
            unbuffered = {**headers, "x-accel-buffering": "no"}
            return Stream(audio, media_type=stream.content_type, headers=unbuffered)
        watch = check.screen.watch_output() if check is not None else None
        body_iter = StreamBody(
            self.settling, stream, p.parsed, res, upstream, event, p.started, watch
        )
        body_iter.unmask = _unmasker(check)
        if lookup is not None and hit is None:  # its events are kept if it ends whole
            body_iter.stream = body_iter.recording = Recording(stream, self.cache.max_bytes, lookup)
        return Stream(body_iter, media_type="text/event-stream", headers={**headers, **SSE_HEADERS})

    async def _refused(self, p: Pending, upstream: Upstream, status: int, body: bytes) -> Response:
        """An upstream's refusal (a JSON error) as the answer, settled with nothing used."""
        await self.settlement.settle(
            p.res, upstream.info.name, Usage(), p.event, p.started, status=status
        )
        return Response(body, status_code=status, media_type="application/json", headers=p.headers)

    async def _screened(
        self, p: Pending, call: Any, upstream: Upstream, charge: bool = True
    ) -> Any:
        """Await the upstream `call` (a whole reply, or a stream opening), the input verdict in
        parallel: the call starts first, the prompt is classified while the upstream works, and
        nothing is returned (so nothing reaches the client) before the verdict. A blocked prompt
        cancels the call and refuses with 400 content_policy_violation; the team is charged only
        what the upstream reported (a reply that was already whole; `charge` False: a cached
        one, nothing), else nothing. A check asked `first` (an image's prompt) is answered before
        the call is made, and a blocked prompt is never sent."""
        if p.check is None:
            return await call
        # the call starts first, its request going out while the prompt is classified; a check
        # asked `first` is answered before the call is made
        task = None if p.check.first else asyncio.ensure_future(call)
        await asyncio.sleep(0)

        def drop() -> None:
            if task is None:
                call.close()  # never sent
            else:
                task.cancel()

        try:
            verdict = await p.check.verdict()
        except BaseException:
            drop()
            raise
        if not verdict.blocked:
            return await (call if task is None else task)
        drop()
        got = None
        if task is not None:
            await asyncio.wait({task})  # done already, or cancelled now
            got = None if task.cancelled() or task.exception() else task.result()
        usage = Usage()
        if isinstance(got, UpstreamReply):
            if got.status == 200 and charge:
                with contextlib.suppress(msgspec.DecodeError):
                    reported = reply_decoder.decode(got.body).usage
                    usage = usage_of(reported, p.event.prompt_reserved, 0)
        elif got is not None:  # a stream that opened: nothing read from it, nothing to charge
            await got.aclose()
        p.event.finish_reason = CONTENT_FILTER
        p.event.error = "content_policy_violation"
        await self.settlement.settle(
            p.res, upstream.info.name, usage, p.event, p.started, status=400
        )
        raise blocked_error(verdict)
