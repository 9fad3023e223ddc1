"""API key → team, through two short-lived caches (this process, then Redis) in front of SQL.

Each cache layer lives `ttl` seconds, so a revoked key stops working within 2 x ttl everywhere
(revoke also deletes the Redis entry, leaving only the in-process layer). Keys are hashed before any
lookup and never logged.
"""

import asyncio
import contextlib
import time

import anyio
import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy import Engine

from gateway.errors import GatewayError
from gateway.keys import TeamPolicy, hash_key, lookup_key

_MAX_LOCAL = 10_000  # bounded so that a flood of random keys cannot grow memory
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TeamPolicy | None)


def cache_key(key_hash: str) -> str:
    return f"ty:key:{key_hash}"


class Authenticator:
    def __init__(self, sql: Engine, redis: aioredis.Redis, ttl: float) -> None:
        self.sql = sql
        self.redis = redis
        self.ttl = ttl
        self._local: dict[str, tuple[float, TeamPolicy | None]] = {}
        # one lookup per key at a time: when the cache entry of a busy key expires, its concurrent
        # requests wait for the same lookup instead of each querying Redis and SQL
        self._inflight: dict[str, asyncio.Future[TeamPolicy | None]] = {}

    async def authenticate(self, authorization: str | None) -> TeamPolicy:
        if not authorization:
            raise GatewayError(
                401,
                "no API key: send 'Authorization: Bearer <key>'",
                code="missing_api_key",
            )
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise GatewayError(401, "malformed Authorization header", code="invalid_api_key")
        policy = await self._lookup(hash_key(key.strip()))
        if policy is None:
            raise GatewayError(401, "invalid or revoked API key", code="invalid_api_key")
        return policy

    async def _lookup(self, key_hash: str) -> TeamPolicy | None:
        now = time.monotonic()
        hit = self._local.get(key_hash)
        if hit is not None and hit[0] > now:
            return hit[1]
        pending = self._inflight.get(key_hash)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = self._inflight[key_hash] = asyncio.get_running_loop().create_future()
        try:
            policy = await self._from_redis_or_sql(key_hash)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            del self._inflight[key_hash]
        if len(self._local) >= _MAX_LOCAL:
            self._local.clear()
        self._local[key_hash] = (now + self.ttl, policy)
        pending.set_result(policy)
        return policy

    async def _from_redis_or_sql(self, key_hash: str) -> TeamPolicy | None:
        name = cache_key(key_hash)
        try:
            cached = await self.redis.get(name)
        except RedisError:
            cached = None  # auth does not need Redis: fall back to SQL
        if cached is not None:
            return _decoder.decode(cached)
        policy = await anyio.to_thread.run_sync(lookup_key, self.sql, key_hash)
        with contextlib.suppress(RedisError):
            await self.redis.set(name, _encoder.encode(policy), px=int(self.ttl * 1000))
        return policy
