"""The tokenyard engine server as a backend (docs/engine-protocol.md), over one or more replicas.

Each replica's `/load` is polled (`refresh`). A request goes to the least-loaded ready replica,
except that requests sharing a prompt prefix (the first ~KV block of the first message or prompt)
go to the same replica, chosen by rendezvous hashing, while its load is within `affinity_margin` of
the least loaded: the engine's prefix cache then serves the shared prefix. A replica that fails is
skipped for `cooldown_s`, and the attempt is retried on another. The model's circuit breaker
counts a failure only once retries are spent, or when a stream breaks and no other replica is ready.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import msgspec

from tokenyard.backends.base import (
    BufferedStream,
    LiveStream,
    ModelInfo,
    UpstreamBroken,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    counted,
    log,
    rendezvous,
)
from tokenyard.backends.checks import PINGS, Check, check
from tokenyard.backends.http import HttpError, HttpPool, HttpResponse
from tokenyard.backends.retry import Guard, Retryable, check_status

JSON = {"content-type": "application/json"}


class _Load(msgspec.Struct):
    model: str
    block_size: int = 0
    total_blocks: int = 0
    free_blocks: int = 0
    waiting: int = 0
    max_model_len: int = 0


class _Count(msgspec.Struct):
    count: int


@dataclass
class Replica:
    url: str
    http: HttpPool
    probe: HttpPool  # its own pool: a probe never waits behind requests
    ready: bool = False
    waiting: int = 0
    kv_usage: float = 0.0
    # this process's requests on it now: between polls, the part of its load known at once
    in_flight: int = 0
    down_until: float = 0.0
    block_size: int = 0
    max_model_len: int = 0

    @property
    def load(self) -> float:
        return self.waiting + self.in_flight + self.kv_usage


class EngineUpstream:
    def __init__(
        self,
        info: ModelInfo,
        urls: tuple[str, ...],
        guard: Guard,
        cooldown_s: float = 5.0,
        affinity_margin: float = 2.0,
        affinity_chars: int = 256,
    ) -> None:
        if not urls:
            raise ValueError(f"{info.name}: no engine replica URLs")
        policy = guard.policy
        self.info = info
        self.replicas = [
            Replica(
                url,
                HttpPool(url, policy.read_timeout_s, policy.connect_timeout_s),
                HttpPool(url, 2.0, policy.connect_timeout_s),
            )
            for url in urls
        ]
        self._guard = guard
        self._cooldown_s = cooldown_s
        self._margin = affinity_margin
        self._chars = affinity_chars

    def pick(self, prefix: str, exclude: set[str] | None = None) -> Replica:
        """The replica for this request: by prefix affinity within the load margin, else the least
        loaded; among the ready ones not cooling down, else those not cooling down (not polled
        yet), else any not yet tried for this request."""
        now = time.monotonic()
        untried = [r for r in self.replicas if r.url not in (exclude or ())] or self.replicas
        usable = [r for r in untried if r.down_until <= now]
        candidates = [r for r in usable if r.ready] or usable or untried
        least = min(candidates, key=lambda r: r.load)
        if prefix and len(candidates) > 1:
            key = prefix[: self._chars].encode()
            home = max(candidates, key=lambda r: rendezvous(key, r.url))
            if home.load <= least.load + self._margin:
                return home
        return least

    async def _send(self, call: UpstreamCall, tried: set[str]) -> tuple[Replica, HttpResponse]:
        """The response of the replica chosen; the request counts as in flight there until its
        response is read or its stream closed."""
        replica = self.pick(call.prefix, tried)
        tried.add(replica.url)
        replica.in_flight += 1
        try:
            return replica, await self._request(replica, call)
        except BaseException:
            replica.in_flight -= 1
            raise

    async def _request(self, replica: Replica, call: UpstreamCall) -> HttpResponse:
        try:
            response = await replica.http.request("POST", call.path, call.body, call.headers)
        except HttpError as exc:
            self._cool(replica, exc)
            raise Retryable(f"{replica.url}: {exc}") from exc
        if response.status == 503:  # the replica is shutting down
            response.close()
            self._cool(replica, "503")
        try:
            check_status(response.status, response.headers)
        except Retryable:
            response.close()
            raise
        return response

    def _cool(self, replica: Replica, why: object) -> None:
        log.warning("engine replica %s failed, skipped %ss: %s", replica.url, self._cooldown_s, why)
        replica.down_until = time.monotonic() + self._cooldown_s

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        tried: set[str] = set()

        async def attempt() -> UpstreamReply:
            replica, response = await self._send(call, tried)
            try:
                body = await response.read()
            except HttpError as exc:
                self._cool(replica, exc)
                raise Retryable(f"{replica.url}: {exc}") from exc
            finally:
                replica.in_flight -= 1
            kind = response.headers.get("content-type", "application/json")
            return UpstreamReply(response.status, body, kind)

        return await self._guard.run(attempt, call.headers.get("x-tenant", ""))

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        reply = await self.complete(replace(call, path="/tokenize"))  # the chat body as is
        if reply.status == 404:  # a server without /tokenize (an older engine): none to ask
            return None
        if reply.status != 200:
            return reply
        try:
            return counted(msgspec.json.decode(reply.body, type=_Count).count)
        except msgspec.DecodeError:
            log.warning("engine /tokenize answered what is not a count: %r", reply.body[:200])
            return None

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        tried: set[str] = set()

        async def attempt() -> (
            tuple[Replica, HttpResponse, bytes, AsyncIterator[bytes]] | BufferedStream
        ):
            replica, response = await self._send(call, tried)
            try:
                if response.status != 200:  # a refusal: JSON, read whole
                    replica.in_flight -= 1
                    return BufferedStream(response.status, await response.read())
                chunks = response.iter_chunks()
                async with asyncio.timeout(self._guard.policy.first_token_timeout_s):
                    first = await anext(chunks, b"")
            except (HttpError, TimeoutError) as exc:
                response.close()
                replica.in_flight -= 1
                self._cool(replica, exc)
                raise Retryable(f"{replica.url}: no first byte: {exc!r}") from exc
            return replica, response, first, chunks

        result = await self._guard.run(attempt, call.headers.get("x-tenant", ""))
        if isinstance(result, BufferedStream):
            return result
        replica, response, first, chunks = result

        async def source() -> AsyncIterator[bytes]:
            yield first
            try:
                async for chunk in chunks:
                    yield chunk
            except HttpError as exc:
                raise UpstreamBroken(f"{self.info.name}: {exc}") from exc

        async def close() -> None:
            response.close()
            replica.in_flight -= 1

        async def broken() -> None:
            self._cool(replica, "a stream broke")
            # one replica dying is not the model failing: the breaker hears of it only when no
            # other replica can take the requests (a crash breaks all its streams at once, which
            # would otherwise open the model's breaker while a healthy replica waits)
            if not any(r.ready and r.down_until <= time.monotonic() for r in self.replicas):
                await self._guard.failed()

        return LiveStream(source(), close, broken)

    async def check(self, kind: str) -> list[Check]:
        """Each replica tried once with the smallest request of `kind` (backends/checks.py)."""
        path, body = PINGS[kind]
        encoded = msgspec.json.encode({**body, "model": self.info.name})

        async def one(replica: Replica) -> Check:
            async def send() -> tuple[int, bytes]:
                try:
                    response = await replica.http.request("POST", path, encoded, JSON)
                    return response.status, await response.read()
                except HttpError as exc:
                    raise Retryable(f"{replica.url}: {exc}") from exc

            return await check(self.info.name, replica.url, send)

        return list(await asyncio.gather(*(one(r) for r in self.replicas)))

    async def _poll(self, replica: Replica) -> None:
        try:
            response = await replica.probe.request("GET", "/load")
            load = msgspec.json.decode(await response.read(), type=_Load)
        except (HttpError, msgspec.DecodeError, msgspec.ValidationError):
            replica.ready = False
            return
        replica.ready = response.status == 200
        replica.waiting = load.waiting
        replica.kv_usage = 1 - load.free_blocks / load.total_blocks if load.total_blocks else 0.0
        replica.block_size = load.block_size
        replica.max_model_len = load.max_model_len

    async def refresh(self) -> None:
        await asyncio.gather(*(self._poll(r) for r in self.replicas))
        ready = [r for r in self.replicas if r.ready]
        if ready:
            least = min(ready, key=lambda r: r.load)
            self.info.waiting = least.waiting
            self.info.kv_usage = least.kv_usage
            self.info.block_size = least.block_size
            # the smallest window, so a request sized for it fits whichever replica serves it
            self.info.max_model_len = min(r.max_model_len for r in ready)
        self._guard.set_reachable(bool(ready))
        await self._guard.refresh()

    async def aclose(self) -> None:
        for replica in self.replicas:
            await replica.http.aclose()
            await replica.probe.aclose()
