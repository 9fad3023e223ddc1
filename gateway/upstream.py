"""The seam between the gateway and whatever serves a model.

`Upstream` is all the gateway knows about a backend: send a request (whole or streamed) and say what
the model is (readiness, KV block size, context window). Today one `EngineUpstream` per model talks
to a tokenyard engine server over HTTP; the router and backends/ (commercial APIs, engine replicas)
plug in behind the same protocol.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from gateway.errors import GatewayError
from gateway.http import HttpError, HttpPool, HttpResponse

log = logging.getLogger("tokenyard.gateway")


class UpstreamBroken(Exception):
    """The upstream failed after the response started (connection lost mid-stream)."""


@dataclass
class ModelInfo:
    name: str
    ready: bool = False
    block_size: int = 0  # 0: not a paged self-hosted engine, no KV-page quota
    max_model_len: int = 0  # 0: unknown
    waiting: int = 0  # requests queued upstream at the last poll
    # prompt tokens the byte estimate misses (chat template, default system prompt), learned from
    # the usage the upstream reports
    prompt_overhead: float = 0.0

    def observe_prompt(self, estimate: int, actual: int) -> None:
        self.prompt_overhead += 0.1 * ((actual - estimate) - self.prompt_overhead)

    @property
    def prompt_extra(self) -> int:
        return max(0, round(self.prompt_overhead))


@dataclass
class UpstreamCall:
    path: str  # /v1/chat/completions or /v1/completions
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # x-tenant, x-priority, x-request-id


@dataclass
class UpstreamReply:
    status: int
    body: bytes
    content_type: str


class UpstreamStream(Protocol):
    status: int

    async def read_all(self) -> bytes:
        """The whole body: for refusals (status >= 400), which are JSON, not SSE."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Raw SSE bytes as they arrive (no framing guaranteed)."""
        ...

    async def aclose(self) -> None:
        """Drop the connection: the engine cancels the sequence and frees its KV blocks."""
        ...


class Upstream(Protocol):
    info: ModelInfo

    async def complete(self, call: UpstreamCall) -> UpstreamReply: ...

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream: ...

    async def refresh(self) -> None:
        """Re-read readiness and load; called periodically."""
        ...

    async def aclose(self) -> None: ...


class _Load(msgspec.Struct):
    model: str
    block_size: int = 0
    max_model_len: int = 0
    waiting: int = 0


def _unavailable(name: str, exc: Exception) -> GatewayError:
    log.warning("upstream %s unreachable: %s", name, exc)
    return GatewayError(
        503, f"model {name!r} is unavailable", code="upstream_unavailable", retry_after=1
    )


class _EngineStream:
    def __init__(self, response: HttpResponse, name: str) -> None:
        self._response = response
        self._name = name
        self.status = response.status

    async def read_all(self) -> bytes:
        try:
            return await self._response.read()
        except HttpError as exc:
            raise _unavailable(self._name, exc) from None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.iter_chunks():
                yield chunk
        except HttpError as exc:
            raise UpstreamBroken(f"{self._name}: {exc}") from exc

    async def aclose(self) -> None:
        self._response.close()


class EngineUpstream:
    """A tokenyard engine server (docs/engine-protocol.md)."""

    def __init__(self, name: str, url: str, timeout: float) -> None:
        self.info = ModelInfo(name=name)
        self._http = HttpPool(url, timeout)
        self._probe = HttpPool(url, 2.0)  # its own pool: a probe never waits behind requests

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        try:
            response = await self._http.request("POST", call.path, call.body, call.headers)
            body = await response.read()
        except HttpError as exc:
            raise _unavailable(self.info.name, exc) from None
        return UpstreamReply(
            response.status, body, response.headers.get("content-type", "application/json")
        )

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        try:
            response = await self._http.request("POST", call.path, call.body, call.headers)
        except HttpError as exc:
            raise _unavailable(self.info.name, exc) from None
        return _EngineStream(response, self.info.name)

    async def refresh(self) -> None:
        try:
            response = await self._probe.request("GET", "/load")
            load = msgspec.json.decode(await response.read(), type=_Load)
        except (HttpError, msgspec.DecodeError, msgspec.ValidationError):
            self.info.ready = False
            return
        self.info.ready = response.status == 200
        self.info.block_size = load.block_size
        self.info.max_model_len = load.max_model_len
        self.info.waiting = load.waiting

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._probe.aclose()


def parse_engine_urls(spec: str, default_model: str) -> list[tuple[str, str]]:
    """ "URL" or "MODEL=URL", comma-separated; a bare URL serves `default_model`."""
    pairs = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, url = item.partition("=")
        pairs.append((name, url) if sep else (default_model, item))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError("one engine URL per model until the router lands: " + spec)
    return pairs


class Backends:
    """The models the gateway can serve, each behind one Upstream; polls their readiness."""

    def __init__(self, upstreams: dict[str, Upstream], poll_s: float = 1.0) -> None:
        self.upstreams = upstreams
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None

    def get(self, model: str) -> Upstream | None:
        return self.upstreams.get(model)

    async def refresh(self) -> None:
        await asyncio.gather(*(u.refresh() for u in self.upstreams.values()))

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.refresh()

    async def aclose(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(*(u.aclose() for u in self.upstreams.values()))
