"""A circuit breaker per backend, shared by every gateway process through Redis.

closed → open after `failures` consecutive failed requests, or an error rate of at least
`error_rate` among at least `min_requests` requests in a `window_s` window; after `open_s`,
half-open: exactly one probe request across all processes (a Redis SET NX lock) → its success closes
the breaker, its failure re-opens it. Transitions run in one Lua script (breaker.lua).

The request path reads a local copy: refreshed from Redis by `refresh()` (the registry polls it
every second) and updated at once by this process's own transitions. Failures are written at once
(they may open the breaker); successes are counted locally and flushed with the next write or
refresh.
"""

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tokenyard.backends.base import BackendUnavailable, log
from tokenyard.backends.metrics import BREAKER_STATE, BREAKER_TRANSITIONS

State = Literal["closed", "open", "half_open"]
_LEVEL = {"closed": 0, "half_open": 1, "open": 2}
_SCRIPT = (Path(__file__).parent / "breaker.lua").read_text()


@dataclass(frozen=True)
class BreakerConfig:
    failures: int = 5
    error_rate: float = 0.5
    min_requests: int = 20
    window_s: float = 30.0
    open_s: float = 30.0
    probe_s: float = 60.0  # the probe lock's lifetime: a probe that never reports frees it


class Breaker:
    def __init__(self, name: str, redis: Redis, config: BreakerConfig) -> None:
        self.name = name
        self.config = config
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)
        base = f"ty:breaker:{{{name}}}"
        self._keys = [base, f"{base}:probe", f"{base}:teams"]
        self._token = os.urandom(8).hex()  # whose probe lock it is
        self._stored: Literal["closed", "open"] = "closed"
        self._open_until = 0.0  # local monotonic deadline of the open state
        self._probing = False  # this process holds the probe lock
        self._oks = 0  # successes not yet flushed to Redis
        self._seen: State = "closed"
        BREAKER_STATE.labels(name).set(0)

    @property
    def state(self) -> State:
        if self._stored == "closed":
            return "closed"
        return "open" if time.monotonic() < self._open_until else "half_open"

    async def admit(self) -> bool:
        """Let a request through, or raise BackendUnavailable; True: the request is the probe."""
        state = self.state
        if state == "closed":
            return False
        if state == "half_open" and not self._probing:
            try:
                won = await self._redis.set(
                    self._keys[1], self._token, nx=True, px=int(self.config.probe_s * 1000)
                )
            except RedisError as exc:
                log.warning("breaker %s: Redis unreachable, probing locally: %s", self.name, exc)
                won = True
            if won:
                self._probing = True
                return True
        raise BackendUnavailable(
            503, f"model {self.name!r} is unavailable", code="circuit_open", retry_after=1
        )

    async def success(self, probe: bool) -> None:
        self._oks += 1
        if probe:
            await self._write(0, probe)

    async def failure(self, probe: bool, team: str = "") -> None:
        """A failed request; `team`: whose request it was, where the failure may be its fault."""
        await self._write(1, probe, team)

    async def release(self, probe: bool) -> None:
        """The request ended without telling anything about the backend (a 4xx caused by the
        request, a cancelled client): a probe hands its lock back for another request."""
        if probe:
            self._probing = False
            try:
                await self._redis.delete(self._keys[1])
            except RedisError as exc:
                log.warning("breaker %s: releasing the probe: %s", self.name, exc)

    async def refresh(self) -> None:
        await self._write(0, False)

    async def _write(self, fails: int, probe: bool, team: str = "") -> None:
        oks, self._oks = self._oks, 0
        if probe:
            self._probing = False
        c = self.config
        args = [oks, fails, int(probe), c.failures, c.error_rate]
        args += [int(c.window_s * 1000), c.min_requests, int(c.open_s * 1000), team]
        try:
            stored, left_ms = await self._script(keys=self._keys, args=args)
        except RedisError as exc:
            log.warning("breaker %s: Redis unreachable, state unchanged: %s", self.name, exc)
            return
        self._stored = "open" if stored in (b"open", "open") else "closed"
        self._open_until = time.monotonic() + int(left_ms) / 1000
        self._observe()

    def _observe(self) -> None:
        state = self.state
        if state != self._seen:
            log.warning("breaker %s: %s → %s", self.name, self._seen, state)
            self._seen = state
            BREAKER_TRANSITIONS.labels(self.name, state).inc()
            BREAKER_STATE.labels(self.name).set(_LEVEL[state])
