"""429s by limit over the last hour, shared by every gateway process: per-minute Redis hashes
(code → count) that expire after the hour. Prometheus' REFUSALS counter is per process and has no
window; this is what the admin UI's live status page reads."""

import contextlib
import time

import redis.asyncio as aioredis
from redis.exceptions import RedisError

WINDOW_MIN = 60


def _bucket(minute: int) -> str:
    return f"ty:refusals:{minute}"


async def record(redis: aioredis.Redis, code: str) -> None:
    """Count one 429; called only on refusals, so it never costs the admitted path anything."""
    name = _bucket(int(time.time() // 60))
    pipe = redis.pipeline(transaction=False)
    pipe.hincrby(name, code, 1)
    pipe.expire(name, (WINDOW_MIN + 2) * 60)
    with contextlib.suppress(RedisError):  # a lost count must not turn a 429 into a 500
        await pipe.execute()


async def last_hour(redis: aioredis.Redis) -> dict[str, int]:
    """429s per code in the last 60 minutes (this minute included), most frequent first."""
    now = int(time.time() // 60)
    pipe = redis.pipeline(transaction=False)
    for minute in range(now - WINDOW_MIN + 1, now + 1):
        pipe.hgetall(_bucket(minute))
    totals: dict[str, int] = {}
    for counts in await pipe.execute():
        for code, n in counts.items():
            key = code.decode()
            totals[key] = totals.get(key, 0) + int(n)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))
