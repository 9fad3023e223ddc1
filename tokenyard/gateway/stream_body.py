"""The SSE body of one streamed response: the upstream's events relayed (usage chunk, output
check, unmasking: gateway/streaming.py), and the request settled exactly once however the stream
ends: whole, failed, cut by the client, or dropped before it was ever read. Speech's audio is
relayed the same way as the provider's own bytes (`BytesBody`).
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tokenyard.backends.base import Upstream, UpstreamBroken, UpstreamReply, UpstreamStream
from tokenyard.core.safety import OutputWatch
from tokenyard.core.usage import Usage, UsageEvent
from tokenyard.gateway import metrics
from tokenyard.gateway.quotas import Reservation
from tokenyard.gateway.response_cache import Lookup, Recording, ResponseCache
from tokenyard.gateway.settlement import Settlement, reply_usage, usage_of
from tokenyard.gateway.streaming import DONE, StreamResult, relay
from tokenyard.gateway.unmasking import Unmasker
from tokenyard.gateway.validation import Parsed


@dataclass(frozen=True)
class Settling:
    """Where a stream's end goes: settled, its whole reply kept by the response cache, in a task
    of the gateway's (`spawn`), because when the client hung up the response's scope is being
    cancelled."""

    settlement: Settlement
    cache: ResponseCache
    spawn: Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class StreamBody:
    """Settles when the relay ends, fails or is cancelled, and also when the response is dropped
    before it was ever iterated (a client gone before the first byte): a plain async generator
    that never started would never run its cleanup."""

    def __init__(
        self,
        settling: Settling,
        stream: UpstreamStream,
        parsed: Parsed,
        res: Reservation,
        upstream: Upstream,
        event: UsageEvent,
        started: float,
        watch: OutputWatch | None = None,
    ) -> None:
        self.settling = settling
        self.watch = watch  # the team's output check (core/safety.py), or None
        self.stream = stream
        self.parsed = parsed
        self.res = res
        self.upstream = upstream
        self.event = event
        self.started = started
        self.result = StreamResult()
        self.settled: asyncio.Task[None] | None = None
        self.recording: Recording | None = None  # where the response cache keeps its events
        self.unmask: Unmasker | None = None  # the prompt's masked values, put back in the reply

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._relay()

    async def _relay(self) -> AsyncIterator[bytes]:
        try:
            rewrite = self.unmask.event if self.unmask is not None else None
            async for piece in relay(
                self.stream,
                self.parsed.include_usage,
                self.result,
                time.perf_counter,
                self.watch,
                rewrite,
            ):
                yield piece
            # the usage event is in Redis before the client sees the stream end
            await asyncio.shield(self._finish())
            if self.result.done:
                yield DONE
        finally:
            self._finish()

    def _finish(self) -> "asyncio.Task[None]":
        if self.settled is None:
            self.settled = self.settling.spawn(self._close_and_settle(*self._outcome()))
        return self.settled

    def _outcome(self) -> tuple[Usage, int, tuple[Lookup, UpstreamReply] | None]:
        """What the stream used, its status, and its whole reply where the cache keeps it; the
        usage event filled in from the relay's result."""
        result, event = self.result, self.event
        usage = Usage() if event.cache_hit else self._used()  # cached: nothing used upstream
        event.timings = result.timings
        event.error = result.error
        event.finish_reason = result.finish_reason
        if result.first_byte is not None:
            event.ttft = result.first_byte - self.started
            if not event.cache_hit:
                metrics.TTFT.labels(self.upstream.info.name).observe(event.ttft)
        status = 200 if result.error is None else 502
        self.res.trace.end_upstream(status, event.ttft)
        kept = None  # a stream that ended whole and unfiltered, to answer the same ask again
        if self.recording is not None and status == 200:
            whole = self.recording.reply()
            if result.done and not result.filtered and whole is not None:
                kept = (self.recording.lookup, whole)
        return usage, status, kept

    def _used(self) -> Usage:
        """What the upstream used: its usage chunk, else the estimate; and what the request
        measured (a streamed transcription's seconds)."""
        usage = usage_of(self.result.usage, self.event.prompt_reserved, self.result.chunks)
        if (metered := self.parsed.metered) is not None:
            usage.audio_seconds = metered.audio_seconds
        return usage

    async def _close_and_settle(
        self, usage: Usage, status: int, kept: tuple[Lookup, UpstreamReply] | None
    ) -> None:
        model = self.upstream.info.name
        try:
            await self.stream.aclose()
            if kept is not None:
                await self.settling.cache.keep(kept[0], model, kept[1])
        finally:
            await self.settling.settlement.settle(
                self.res, model, usage, self.event, self.started, status
            )

    def __del__(self) -> None:
        if self.settled is None:
            with contextlib.suppress(RuntimeError):  # no running loop: shutting down
                self._finish()


class BytesBody(StreamBody):
    """The provider's own bytes (speech's audio) relayed as they arrive, so a client plays the
    start while the rest is made; settled once as any stream is, by what the request measured
    (its characters: the provider charges the whole input, however much of the audio was read)."""

    async def _relay(self) -> AsyncIterator[bytes]:
        result = self.result
        try:
            try:
                async for data in self.stream.chunks():
                    if result.first_byte is None:
                        result.first_byte = time.perf_counter()
                    yield data
            except UpstreamBroken as exc:
                result.error = str(exc)
                await asyncio.shield(self._finish())
                raise  # the connection drops mid-body: the client sees the audio cut short
            await asyncio.shield(self._finish())
        finally:
            self._finish()

    def _used(self) -> Usage:
        return reply_usage(None, self.event.prompt_reserved, self.parsed.metered)
