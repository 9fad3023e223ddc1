"""SSE relay: pass the upstream's events through as they arrive, watching for the usage chunk.

The gateway always asks the upstream for the usage chunk (it settles quotas from it) and drops it
again when the client did not ask for it. The closing `data: [DONE]` is held back: the caller sends
it once the request is settled, so its usage event is durable before the client sees the end.
Events are forwarded per upstream read, so a slow client slows the upstream read (backpressure)
instead of buffering without bound.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokenyard.backends.base import UpstreamBroken, UpstreamStream
from tokenyard.backends.sse import Splitter
from tokenyard.core.safety import OutputWatch
from tokenyard.gateway.screening import CONTENT_FILTER, cut_event


class _Details(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # written to the provider's prompt cache (Anthropic's premium)


class UsageIn(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _Details | None = None
    # the Responses API's names for the same counts (OpenAI's models serve it natively)
    input_tokens: int = 0
    output_tokens: int = 0
    input_tokens_details: _Details | None = None
    # all a rerank server (Jina's, vLLM's) reports: what it read
    total_tokens: int = 0
    seconds: float = 0.0  # a transcription's audio, where priced by duration (whisper-1)

    @property
    def prompt(self) -> int:
        return (
            self.prompt_tokens or self.input_tokens or max(0, self.total_tokens - self.completion)
        )

    @property
    def completion(self) -> int:
        return self.completion_tokens or self.output_tokens

    @property
    def cached(self) -> int:
        details = self.prompt_tokens_details or self.input_tokens_details
        return details.cached_tokens if details else 0

    @property
    def written(self) -> int:
        details = self.prompt_tokens_details or self.input_tokens_details
        return details.cache_write_tokens if details else 0


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    index: int = 0
    delta: _Delta | None = None  # chat (the output check reads the text)
    text: str | None = None  # legacy completions


class _Response(msgspec.Struct):
    usage: UsageIn | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: UsageIn | None = None
    timings: dict[str, Any] | None = None
    # a Responses API event (OpenAI's models): the finished response carries the usage
    response: _Response | None = None


class Reply(msgspec.Struct):
    """The parts of a non-streamed completion the gateway reads."""

    choices: list[_Choice] = []
    usage: UsageIn | None = None
    timings: dict[str, Any] | None = None
    duration: float | None = None  # a transcription's audio in seconds (verbose_json)

    @property
    def finish_reason(self) -> str | None:
        return next((c.finish_reason for c in self.choices if c.finish_reason), None)


class _Meta(msgspec.Struct):
    """What the stream's own last event repeats of its chunks."""

    id: str = ""
    object: str = ""
    created: int = 0
    model: str = ""


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_meta_decoder = msgspec.json.Decoder(_Meta)
reply_decoder = msgspec.json.Decoder(Reply)


@dataclass
class StreamResult:
    usage: UsageIn | None = None
    timings: dict[str, Any] | None = None
    chunks: int = 0  # content chunks seen: the completion-token estimate if usage never comes
    error: str | None = None
    first_byte: float | None = field(default=None)
    finish_reason: str | None = None  # the first choice's, as the upstream reported it
    done: bool = False  # the upstream ended with `data: [DONE]` (held back: see relay)
    filtered: bool = False  # the output check ended the stream (finish_reason content_filter)


def error_event(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


def _keep(event: bytes, result: StreamResult, include_usage: bool) -> bool:
    return _read(event, result, include_usage)[0]


def _read(event: bytes, result: StreamResult, include_usage: bool) -> tuple[bool, _Chunk | None]:
    """Whether to forward the event, and the chunk it held."""
    if not event.startswith(b"data:"):
        return True, None  # comments, retry hints: pass through
    payload = event[5:].strip()
    if payload == b"[DONE]":
        result.done = True
        return False, None
    try:
        chunk = _chunk_decoder.decode(payload)
    except msgspec.DecodeError:
        return True, None
    return _kept(chunk, result, include_usage), chunk


def _kept(chunk: _Chunk, result: StreamResult, include_usage: bool) -> bool:
    if chunk.choices:
        result.chunks += 1
        if chunk.choices[0].finish_reason and result.finish_reason is None:
            result.finish_reason = chunk.choices[0].finish_reason
    if chunk.response is not None and chunk.response.usage is not None:
        result.usage = chunk.response.usage
    if chunk.usage is not None:
        result.usage = chunk.usage
        result.timings = chunk.timings
        return include_usage or bool(chunk.choices)
    return True


def _watched(
    event: bytes, result: StreamResult, include_usage: bool, watch: OutputWatch, seen: set[int]
) -> tuple[bool, bytes | None]:
    """_keep, and the reply's text fed to the output check: (forward?, the stream's last event
    when the check ends it). The chunk that finishes the reply is held until the rest of the
    reply is checked, so a reply never ends "stop" on unchecked text."""
    keep, chunk = _read(event, result, include_usage)
    if chunk is None or not chunk.choices:
        return keep, None
    text = "".join(
        (c.delta.content if c.delta is not None else c.text) or "" for c in chunk.choices
    )
    seen.update(c.index for c in chunk.choices)
    verdict = watch.feed(text)
    if verdict is None and any(c.finish_reason for c in chunk.choices):
        verdict = watch.finish()
    if verdict is None or not verdict.blocked:
        return keep, None
    result.filtered = True
    result.finish_reason = CONTENT_FILTER
    result.done = True  # the client's stream still ends with [DONE]
    meta = _meta_decoder.decode(event[5:].strip())
    return False, cut_event(
        msgspec.structs.asdict(meta), sorted(seen), meta.object.startswith("chat")
    )


def _sent(events: list[bytes], rewrite: Callable[[bytes], bytes] | None) -> list[bytes]:
    return [(rewrite(e) if rewrite else e) + b"\n\n" for e in events]


async def relay(
    stream: UpstreamStream,
    include_usage: bool,
    result: StreamResult,
    clock: Any,
    watch: OutputWatch | None = None,
    rewrite: Callable[[bytes], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """`watch`: the team's output check (core/safety.py); a violation ends the stream with
    finish_reason "content_filter", and nothing more is read from the upstream. `rewrite`: what
    each event becomes for the client (gateway/unmasking.py), after the check read it."""
    splitter = Splitter()
    seen: set[int] = set()
    try:
        async for data in stream.chunks():
            if result.first_byte is None:
                result.first_byte = clock()
            events = splitter.feed(data)
            if watch is None:
                out = [e for e in events if _keep(e, result, include_usage)]
            else:
                out = []
                for e in events:
                    keep, cut = _watched(e, result, include_usage, watch, seen)
                    if cut is not None:
                        yield b"".join([*_sent(out, rewrite), cut])
                        return
                    if keep:
                        out.append(e)
            if out:
                yield b"".join(_sent(out, rewrite))
    except UpstreamBroken as exc:
        result.error = str(exc)
        yield error_event("the model's server failed mid-stream", "upstream_error")


DONE = b"data: [DONE]\n\n"
# a proxy in front (nginx and ingresses built on it) must neither cache nor buffer an event stream
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
