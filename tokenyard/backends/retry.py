"""Retries before the first byte, and the breaker around them: one `Guard` per backend.

An attempt raises `Retryable` when it failed before any byte of the response reached us (connection
refused or reset, connect/first-token/read timeout with nothing received, 429, 5xx): sending it
again cannot duplicate output. Once a stream's first byte arrived the request is never retried; a
later failure is `UpstreamBroken`. Backoff is exponential with jitter; an upstream's Retry-After
(seconds) replaces it, capped.
"""

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from tokenyard.backends.base import BackendUnavailable, ModelInfo, log
from tokenyard.backends.breaker import Breaker
from tokenyard.backends.metrics import RETRIES

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3  # the first included
    backoff_s: float = 0.25
    backoff_max_s: float = 4.0
    retry_after_max_s: float = 10.0
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 60.0
    read_timeout_s: float = 600.0


class Retryable(Exception):
    """An attempt failed before the first byte of its response: safe to send again."""

    def __init__(
        self, reason: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait an upstream asks for, in seconds: OpenAI's and Azure's `retry-after-ms` where
    present (finer than whole seconds), else Retry-After in seconds (an HTTP date is ignored: the
    backoff applies)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, ""))
        except ValueError:
            continue
        if value >= 0 and math.isfinite(value):
            return value * scale
    return None


def check_status(status: int, headers: Mapping[str, str]) -> None:
    """429 and 5xx are worth another try; other refusals are the request's fault."""
    if status == 429 or status >= 500:
        raise Retryable(f"HTTP {status}", status, retry_after(headers))


class Guard:
    """Runs a backend's attempts: the breaker admits the request, tenacity retries it, the outcome
    is reported to the breaker. Exhausted retries become BackendUnavailable. Keeps the backend's
    `info.circuit` and `info.ready` (reachable and not open) current."""

    def __init__(
        self, info: ModelInfo, policy: RetryPolicy, breaker: Breaker | None = None
    ) -> None:
        self.info = info
        self.name = info.name
        self.policy = policy
        self.breaker = breaker
        self.reachable = False  # what the backend's own probe says
        # composed from waits whose arguments every tenacity 8-9 takes alike (9.2 renamed
        # wait_exponential_jitter's first argument, which 9.1 does not know by its new name)
        self._backoff = wait_exponential(
            multiplier=policy.backoff_s, max=policy.backoff_max_s
        ) + wait_random(0, policy.backoff_s)

    def set_reachable(self, reachable: bool) -> None:
        self.reachable = reachable
        self._sync()

    async def refresh(self) -> None:
        if self.breaker:
            await self.breaker.refresh()
        self._sync()

    def _sync(self) -> None:
        self.info.circuit = self.breaker.state if self.breaker else "closed"
        self.info.ready = self.reachable and self.info.circuit != "open"

    def _wait(self, state: RetryCallState) -> float:
        assert state.outcome is not None
        exc = state.outcome.exception()
        if isinstance(exc, Retryable):
            RETRIES.labels(self.name, f"http_{exc.status}" if exc.status else "connection").inc()
            if exc.retry_after is not None:
                return min(exc.retry_after, self.policy.retry_after_max_s)
        return min(self._backoff(state), self.policy.backoff_max_s)

    async def run(self, attempt: Callable[[], Awaitable[T]], team: str = "") -> T:
        """`team`: whose request it is. An upstream that answers it with a 500 may be failing on
        what that team sent, which alone must not open the breaker every team shares."""
        probe = await self.breaker.admit() if self.breaker else False
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, self.policy.attempts)),
            wait=self._wait,
            retry=retry_if_exception_type(Retryable),
            reraise=True,
        )

        async def once() -> T:  # tenacity awaits only coroutine functions, not lambdas
            return await attempt()

        try:
            result = await retrying(once)
        except Retryable as exc:
            await self.failed(probe, team if exc.status == 500 else "")
            raise self._exhausted(exc) from None
        except BaseException:
            if self.breaker:
                await self.breaker.release(probe)
            raise
        if self.breaker:
            await self.breaker.success(probe)
            self._sync()
        return result

    async def failed(self, probe: bool = False, team: str = "") -> None:
        """A request failed: after retries, or its stream broke mid-way."""
        if self.breaker:
            await self.breaker.failure(probe, team)
            self._sync()

    def _exhausted(self, exc: Retryable) -> BackendUnavailable:
        log.warning("upstream %s failed after retries: %s", self.name, exc.reason)
        if exc.status == 429:
            return BackendUnavailable(
                429,
                f"model {self.name!r} is rate limited by its provider",
                code="upstream_rate_limited",
                retry_after=max(1, math.ceil(exc.retry_after or 1)),
            )
        return BackendUnavailable(
            503, f"model {self.name!r} is unavailable", code="upstream_unavailable", retry_after=1
        )
