"""API key → team, through two short-lived caches (this process, then Redis) in front of SQL.

Each cache layer lives `ttl` seconds, so a revoked key stops working within 2 x ttl everywhere
(revoke and team changes delete the Redis entries, tenancy/service.py, leaving only the in-process
layer). Keys are hashed before any lookup and never logged. Each key's last use goes to a Redis hash
by its prefix, at most once per _LAST_USED_EVERY_S per process, in the background: never a SQL
write per request.
"""

import asyncio
import contextlib
import time
from collections.abc import Mapping

import anyio
import msgspec
import redis.asyncio as aioredis
from litestar.connection import ASGIConnection
from redis.exceptions import RedisError
from sqlalchemy import Engine

from tokenyard.core.errors import GatewayError
from tokenyard.gateway.scopes import check_scope
from tokenyard.tenancy.keys import KEY_PREFIX_LEN, bearer_key, hash_key, lookup_key
from tokenyard.tenancy.policy import TeamPolicy
from tokenyard.tenancy.service import cache_key

_MAX_LOCAL = 10_000  # bounded so that a flood of random keys cannot grow memory
LAST_USED = "ty:key-last-used"  # hash: key prefix -> unix time of its last authenticated request
_LAST_USED_EVERY_S = 5.0
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TeamPolicy | None)


def authorization_of(headers: Mapping[str, str]) -> str | None:
    """The team key as `Authorization: Bearer …`, or as Anthropic's SDK sends it (`x-api-key`),
    or Google's (`x-goog-api-key`)."""
    authorization = headers.get("authorization")
    if authorization is None:
        key = headers.get("x-api-key") or headers.get("x-goog-api-key")
        return f"Bearer {key}" if key else None
    return authorization


class Authenticator:
    def __init__(self, sql: Engine, redis: aioredis.Redis, ttl: float) -> None:
        self.sql = sql
        self.redis = redis
        self.ttl = ttl
        self._local: dict[str, tuple[float, TeamPolicy | None]] = {}
        # one lookup per key at a time: when the cache entry of a busy key expires, its concurrent
        # requests wait for the same lookup instead of each querying Redis and SQL
        self._inflight: dict[str, asyncio.Future[TeamPolicy | None]] = {}
        self._last_used: dict[str, float] = {}  # prefix -> when this process last wrote it
        self._tasks: set[asyncio.Task[None]] = set()

    async def authenticate(self, authorization: str | None, *, path: str) -> TeamPolicy:
        """The policy of the key in `authorization`, which must be allowed the kind of endpoint
        `path` is (gateway/scopes.py)."""
        if not authorization:
            raise GatewayError(
                401,
                "no API key: send 'Authorization: Bearer <key>'",
                code="missing_api_key",
            )
        key = bearer_key(authorization)
        if key is None:
            raise GatewayError(401, "malformed Authorization header", code="invalid_api_key")
        policy = await self._lookup(hash_key(key))
        if policy is None:
            raise GatewayError(401, "invalid or revoked API key", code="invalid_api_key")
        self._mark_used(key[:KEY_PREFIX_LEN])
        check_scope(policy, path)
        return policy

    async def caller(self, connection: ASGIConnection) -> TeamPolicy:
        """The policy of the key a request carries (authorization_of: Bearer, `x-api-key` or
        `x-goog-api-key`), allowed the kind of endpoint its path is."""
        return await self.authenticate(
            authorization_of(connection.headers), path=connection.scope["path"]
        )

    def _mark_used(self, prefix: str) -> None:
        now = time.time()
        if now - self._last_used.get(prefix, 0.0) < _LAST_USED_EVERY_S:
            return
        if len(self._last_used) >= _MAX_LOCAL:
            self._last_used.clear()
        self._last_used[prefix] = now
        task = asyncio.get_running_loop().create_task(self._write_last_used(prefix, now))
        self._tasks.add(task)  # referenced until done, or the loop may collect it mid-flight
        task.add_done_callback(self._tasks.discard)

    async def _write_last_used(self, prefix: str, now: float) -> None:
        with contextlib.suppress(RedisError):  # a missed timestamp is harmless
            await self.redis.hset(LAST_USED, prefix, str(int(now)))

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
