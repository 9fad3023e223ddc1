"""Gemini's explicit context caches (`cachedContents`): content a team stores once and names in
later generateContent requests instead of sending it again.

A cache lives in Redis under its team's hash tag and expires there by itself at its `expireTime`
(its `ttl` from creation, one hour by default, at most a week): nothing to purge. The team's index
(a sorted set by expiry) lists them. Read by (team, id): another team's cache is a missing one.
What a request gains is the provider's own: a self-hosted engine finds the cached prefix in its
prefix cache; for the others the gateway sends the contents as part of the prompt.
"""

import re
import time
from datetime import UTC, datetime
from typing import Any

import msgspec
import redis.asyncio as aioredis

from tokenyard.core.errors import GatewayError
from tokenyard.core.ids import new_id

DEFAULT_TTL_S = 3600.0  # Gemini's default
MAX_TTL_S = 7 * 86400.0
PREFIX = "cachedContents/"
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]{1,9})?)s")
_HELD = ("contents", "systemInstruction", "tools", "toolConfig")  # what a cache holds


def _key(team: str, cache_id: str) -> str:
    return f"ty:{{{team}}}:gemini-cache:{cache_id}"


def _index(team: str) -> str:
    return f"ty:{{{team}}}:gemini-caches"


def _stamp(unix: float) -> str:
    """Unix seconds in RFC 3339, as Google's API writes times."""
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def missing_cache(name: str) -> GatewayError:
    return GatewayError(404, f"cached content {name!r} is not found", param="cachedContent")


def expiry(body: dict[str, Any], now: float) -> float:
    """When a cache asked for as `ttl` ("300s") or `expireTime` (RFC 3339) expires; a 400 beyond
    a week or in the past."""
    ttl, expire = body.get("ttl"), body.get("expireTime") or body.get("expire_time")
    if ttl is not None and expire is not None:
        raise GatewayError(400, "give ttl or expireTime, not both", param="ttl")
    if expire is not None:
        try:
            at = datetime.fromisoformat(str(expire).replace("Z", "+00:00")).timestamp()
        except ValueError:
            why = "expireTime must be an RFC 3339 time"
            raise GatewayError(400, why, param="expireTime") from None
    elif ttl is not None:
        found = _DURATION.fullmatch(str(ttl))
        if found is None:
            raise GatewayError(400, "ttl must be a duration such as '300s'", param="ttl")
        at = now + float(found[1])
    else:
        at = now + DEFAULT_TTL_S
    if not now < at <= now + MAX_TTL_S:
        raise GatewayError(400, "a cache lives from 1 s to 7 days", param="ttl")
    return at


class CacheStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def create(
        self, team: str, model: str, held: dict[str, Any], tokens: int, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A new cache of `held` (contents and the rest) for `model`; `tokens`: their size."""
        now = time.time()
        at = expiry(body, now)
        cache = {
            "name": PREFIX + new_id("cache"),
            "model": f"models/{model}",
            "displayName": str(body.get("displayName") or body.get("display_name") or ""),
            "createTime": _stamp(now),
            "updateTime": _stamp(now),
            "expireTime": _stamp(at),
            "usageMetadata": {"totalTokenCount": tokens},
            **{k: v for k, v in held.items() if v is not None},
        }
        await self._write(team, cache, at)
        return cache

    async def get(self, team: str, name: str) -> dict[str, Any] | None:
        raw = await self.redis.get(_key(team, name.removeprefix(PREFIX)))
        return None if raw is None else msgspec.json.decode(raw)

    async def extend(self, team: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """A cache given a new expiry (`ttl` or `expireTime`); None where it is gone."""
        cache = await self.get(team, name)
        if cache is None:
            return None
        now = time.time()
        at = expiry(body, now)
        cache |= {"updateTime": _stamp(now), "expireTime": _stamp(at)}
        await self._write(team, cache, at)
        return cache

    async def listed(self, team: str) -> list[dict[str, Any]]:
        """The team's live caches, the soonest to expire first (without their contents)."""
        await self.redis.zremrangebyscore(_index(team), 0, time.time())
        ids = [i.decode() for i in await self.redis.zrange(_index(team), 0, -1)]
        raws = await self.redis.mget([_key(team, i) for i in ids]) if ids else []
        caches = [msgspec.json.decode(r) for r in raws if r is not None]
        return [{k: v for k, v in c.items() if k not in _HELD} for c in caches]

    async def delete(self, team: str, name: str) -> bool:
        cache_id = name.removeprefix(PREFIX)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(_key(team, cache_id)).zrem(_index(team), cache_id)
            gone, _ = await pipe.execute()
        return bool(gone)

    async def _write(self, team: str, cache: dict[str, Any], at: float) -> None:
        cache_id = cache["name"].removeprefix(PREFIX)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(_key(team, cache_id), msgspec.json.encode(cache), pxat=int(at * 1000))
            pipe.zadd(_index(team), {cache_id: at})
            await pipe.execute()


def held_by(body: dict[str, Any]) -> dict[str, Any]:
    """What a create request asks to cache, under Gemini's camelCase names."""
    return {name: body.get(name) for name in _HELD}


def with_cache(body: dict[str, Any], cache: dict[str, Any], model: str) -> dict[str, Any]:
    """A generateContent body that names `cache`, with the cache's contents before its own, and
    its instructions and tools: as Gemini does, one set by both is a 400, as is another model."""
    if cache["model"] != f"models/{model}":
        why = f"cached content was created for {cache['model']}, not models/{model}"
        raise GatewayError(400, why, param="cachedContent")
    merged = {k: v for k, v in body.items() if k != "cachedContent"}
    for name in ("systemInstruction", "tools", "toolConfig"):
        if cache.get(name) is not None:
            if merged.get(name) is not None:
                why = f"{name} is in the cached content: it cannot be set again"
                raise GatewayError(400, why, param=name)
            merged[name] = cache[name]
    own = merged.get("contents") or []
    own = own if isinstance(own, list) else [own]  # one Content alone, as Gemini accepts
    merged["contents"] = [*(cache.get("contents") or []), *own]
    return merged
