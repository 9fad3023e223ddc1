"""Each deployment's own requests and tokens per minute (LiteLLM's per-deployment rpm/tpm): an
Azure deployment's quota, a provider account's tier. Counted in Redis by every gateway in one
script (deployment_limits.lua), so a deployment at its limit is passed over before a request is
sent to it, not after its 429. Tokens are counted as Azure's own limiter counts them when a request
arrives: the prompt's estimate and the output cap."""

from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tokenyard.backends.base import log

_SCRIPT = (Path(__file__).parent / "deployment_limits.lua").read_text()
WINDOW_TTL_S = 120  # a minute's counts outlive it, for the requests that straddle its end


class DeploymentLimits:
    def __init__(self, model: str, redis: Redis) -> None:
        self._base = f"ty:deployment:{{{model}}}"
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)

    async def take(self, deployment: str, rpm: int, tpm: int, tokens: int) -> int:
        """0 if the deployment takes the request this minute (now counted); else the seconds
        until the next minute. Redis unreachable: taken (the provider's own limit still holds,
        and its 429 cools the deployment)."""
        try:
            taken, wait = await self._script(
                keys=[f"{self._base}:{deployment}"], args=[rpm, tpm, tokens, WINDOW_TTL_S]
            )
        except RedisError as exc:
            log.warning("deployment limits unavailable, not applied: %s", exc)
            return 0
        return 0 if int(taken) else max(1, int(wait))

    async def used(self, deployment: str) -> tuple[int, int]:
        """Its requests and tokens counted this minute (Redis's), for the status page."""
        seconds, _ = await self._redis.time()
        counts = await self._redis.hmget(
            f"{self._base}:{deployment}:{int(seconds) // 60}", "r", "t"
        )
        return int(counts[0] or 0), int(counts[1] or 0)
