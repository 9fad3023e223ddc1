"""Sign-in attempts per client address, shared by every gateway through Redis.

Each attempt is counted before its password or key is compared, in one atomic script, so however
many arrive at once at most LIMIT are ever compared per window; a successful sign-in gives its
attempt back, so only failures use up the allowance (and a valid team key cannot reset it).
"""

import redis.asyncio as aioredis

LIMIT = 10  # sign-ins compared per client address; beyond, sign-in answers 429 ...
WINDOW_S = 300  # ... until this long after the client's last attempt

# INCRBY and EXPIRE in one step: no count is ever left without an expiry
_COUNT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return n
"""


def _name(client: str) -> str:
    return f"ty:admin-login-fail:{client}"


async def _add(redis: aioredis.Redis, client: str, delta: int) -> int:
    return int(await redis.eval(_COUNT, 1, _name(client), delta, WINDOW_S))


async def admit(redis: aioredis.Redis, client: str) -> bool:
    """Count one attempt; False once the client has used up its allowance for the window."""
    return await _add(redis, client, 1) <= LIMIT


async def succeeded(redis: aioredis.Redis, client: str) -> None:
    """Give back the attempt of a sign-in that succeeded."""
    await _add(redis, client, -1)
