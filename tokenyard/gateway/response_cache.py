"""Answers kept in Redis for requests that would get the same answer again.

A team that sends the same deterministic request twice (greedy decoding or a fixed seed; any
embedding) gets the first answer back without an upstream call: no tokens, no cost, in a Redis
round trip. Entries are the team's own (the key holds its name, under its hash tag) and live the
team's `cache_ttl_s`, else `TOKENYARD_GATEWAY_CACHE_TTL_S` (0: not cached); only whole 200 replies
the output check left untouched are kept. A client steers it per request with `Cache-Control`:
`no-cache` asks the upstream again (and keeps the new answer), `no-store` neither reads nor keeps
one. A streamed request is kept apart from the same request unstreamed: its upstream's events are
recorded as they are relayed and, asked again, replayed through the same relay (so the output check
and the client's `include_usage` apply as they would upstream).
"""

import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenyard.backends.base import UpstreamReply, UpstreamStream
from tokenyard.gateway import metrics
from tokenyard.gateway.validation import GENERATING, Kind, Parsed
from tokenyard.tenancy.policy import TeamPolicy

log = logging.getLogger("tokenyard.gateway")

Mode = Literal["use", "refresh", "skip"]  # read and keep; keep only; neither
# fields that label a request without changing its answer: two requests differing only in them
# share an entry
_LABELS = ("user", "safety_identifier", "metadata", "stream", "stream_options", "service_tier")


class Entry(msgspec.Struct, array_like=True):
    model: str  # the model that answered (model="auto" may have routed anywhere)
    content_type: str
    body: bytes


@dataclass
class Lookup:
    """One request's place in the cache."""

    key: str
    read: bool  # False: Cache-Control no-cache (ask the upstream again, keep its answer)
    ttl_ms: int  # how long an answer is kept: the team's time, else the platform's
    entry: Entry | None = None  # what was found

    @property
    def header(self) -> str:
        """x-tokenyard-cache: hit, miss or refresh."""
        if not self.read:
            return "refresh"
        return "hit" if self.entry is not None else "miss"


def mode_of(cache_control: str | None) -> Mode:
    directives = {d.strip().lower() for d in (cache_control or "").split(",")}
    if "no-store" in directives:
        return "skip"
    return "refresh" if "no-cache" in directives else "use"


def _deterministic(kind: Kind, body: dict[str, Any]) -> bool:
    """Whether asking again would give the same answer: an embedding or a ranking; a completion
    decoded greedily or with a seed of the client's. Never an image, audio or a transcription
    (sampled, and too large to keep)."""
    if kind in ("embedding", "rerank"):
        return True
    if kind in GENERATING:
        return body.get("temperature") == 0 or body.get("seed") is not None
    return False


class ResponseCache:
    def __init__(self, redis: aioredis.Redis, ttl_s: float, max_bytes: int) -> None:
        self.redis = redis
        self.ttl_s = ttl_s  # the platform's; a team may have its own (TeamPolicy.cache_ttl_s)
        self.max_bytes = max_bytes

    def lookup(self, kind: Kind, policy: TeamPolicy, parsed: Parsed, mode: Mode) -> Lookup | None:
        """The request's place, or None when it is not cached (off for the team, sampled,
        no-store). Call it before the body is changed for the upstream."""
        ttl_s = self.ttl_s if policy.cache_ttl_s is None else policy.cache_ttl_s
        if ttl_s <= 0 or mode == "skip":
            return None
        if not _deterministic(kind, parsed.body):
            return None
        # the length cap by value: parse keeps it as parsed.max_tokens under either of its names
        asked = {k: v for k, v in parsed.body.items() if k not in (*_LABELS, "max_tokens")}
        # a stream's entry is its events, a reply's its JSON: the same ask in each form is two
        canonical = msgspec.json.encode(
            [kind, parsed.stream, parsed.max_tokens, asked], order="sorted"
        )
        key = f"ty:{{{policy.team}}}:cache:{hashlib.sha256(canonical).hexdigest()}"
        return Lookup(key, read=mode == "use", ttl_ms=max(1, round(ttl_s * 1000)))

    async def find(self, lookup: Lookup) -> None:
        """Fill `lookup.entry` from Redis (a request that may read)."""
        if not lookup.read:
            return
        try:
            raw = await self.redis.get(lookup.key)
        except RedisError as exc:  # the cache is an optimisation: without Redis, ask upstream
            log.warning("response cache unreadable: %s", exc)
            raw = None
        entry = None
        if raw is not None:
            try:
                entry = msgspec.msgpack.decode(raw, type=Entry)
            except msgspec.DecodeError:
                entry = None
        metrics.CACHE.labels("hit" if entry else "miss").inc()
        lookup.entry = entry

    async def keep(self, lookup: Lookup, model: str, reply: UpstreamReply) -> None:
        if len(reply.body) > self.max_bytes:
            return
        value = msgspec.msgpack.encode(Entry(model, reply.content_type, reply.body))
        try:
            await self.redis.set(lookup.key, value, px=lookup.ttl_ms)
        except RedisError as exc:
            log.warning("response cache unwritable: %s", exc)


class Recording:
    """An upstream stream whose bytes are also kept, up to `limit`, to be cached at `lookup`'s
    place when it ends whole."""

    def __init__(self, stream: UpstreamStream, limit: int, lookup: Lookup) -> None:
        self.stream = stream
        self.lookup = lookup
        self.status = stream.status
        self.content_type = stream.content_type
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0  # past the limit the parts are dropped: nothing will be kept

    async def read_all(self) -> bytes:
        return await self.stream.read_all()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for data in self.stream.chunks():
            self.size += len(data)
            if self.size <= self.limit:
                self.parts.append(data)
            else:
                self.parts.clear()
            yield data

    async def aclose(self) -> None:
        await self.stream.aclose()

    def reply(self) -> UpstreamReply | None:
        """What was read, as the entry to keep; None past the limit."""
        if self.size > self.limit:
            return None
        return UpstreamReply(200, b"".join(self.parts), "text/event-stream")


class Replay:
    """A kept stream's events, served where the upstream's stream would be."""

    status = 200
    content_type = "text/event-stream"

    def __init__(self, events: bytes) -> None:
        self.events = events

    async def read_all(self) -> bytes:
        return self.events

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.events

    async def aclose(self) -> None:
        return None
