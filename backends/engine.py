"""The tokenyard engine server as a backend (docs/engine-protocol.md)."""

import logging
from collections.abc import AsyncIterator

import msgspec

from backends.base import (
    ModelInfo,
    UpstreamBroken,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    unavailable,
)
from backends.http import HttpError, HttpPool, HttpResponse

log = logging.getLogger("tokenyard.backends")


class _Load(msgspec.Struct):
    model: str
    block_size: int = 0
    max_model_len: int = 0
    waiting: int = 0


class _EngineStream:
    def __init__(self, response: HttpResponse, name: str) -> None:
        self._response = response
        self._name = name
        self.status = response.status

    async def read_all(self) -> bytes:
        try:
            return await self._response.read()
        except HttpError as exc:
            raise unavailable(self._name, exc) from None

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
            raise unavailable(self.info.name, exc) from None
        return UpstreamReply(
            response.status, body, response.headers.get("content-type", "application/json")
        )

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        try:
            response = await self._http.request("POST", call.path, call.body, call.headers)
        except HttpError as exc:
            raise unavailable(self.info.name, exc) from None
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
