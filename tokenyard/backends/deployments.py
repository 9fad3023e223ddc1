"""Where a commercial model's requests go: one or more deployments of it (Azure regions, accounts
with their own keys and rate limits), each over its own pooled client.

Each attempt picks a deployment by weight and load: the least `(in flight + e) / weight`, with e
drawn from Exp(1) per deployment and pick. Idle, that is a draw in proportion to the weights (the
least of exponentials scaled by weights falls to each with probability weight / total); busy, the
requests in flight outweigh the draw and the least loaded per unit of weight wins. Requests that
share a prompt prefix (the first message, or the client's `prompt_cache_key`) go instead to one
home deployment, chosen by weighted rendezvous hashing, while its load per unit of weight is
within `affinity_margin` of the least loaded's: OpenAI's and Azure's prompt caches are each
deployment's own, and a cached prefix is billed at a fraction of its price. A deployment
that fails before the first byte (429, 5xx, connection, first-token timeout) is skipped for its
Retry-After, or `cooldown_s` without one, and the attempt moves to another at once; only when none
is left does the model's backoff apply. The model's breaker hears of a failure only once its tries
are spent, or when a stream breaks and no other deployment can take requests: one region down is
not the model down. A deployment with its own rpm or tpm is passed over while this minute's
counts, shared in Redis by every gateway (deployment_limits.py), say it is full.
"""

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tokenyard.backends.anthropic_clouds import Cloud
from tokenyard.backends.api import ApiClient
from tokenyard.backends.base import (
    BackendUnavailable,
    LiveStream,
    ModelInfo,
    UpstreamCall,
    UpstreamReply,
    log,
    rendezvous,
)
from tokenyard.backends.checks import PINGS, Check, check
from tokenyard.backends.deployment_limits import DeploymentLimits
from tokenyard.backends.metrics import DEPLOYMENT_REQUESTS
from tokenyard.backends.retry import Guard, Retryable

T = TypeVar("T")
COOLDOWN_MAX_S = 300.0  # a Retry-After longer than this is the provider's quota reset, not a pause


@dataclass
class Deployment:
    name: str  # in logs and metrics: never the key
    api: ApiClient
    model: str  # the provider's name for the model there
    query: str = ""  # what every path takes after it (Azure's ?api-version=…)
    weight: float = 1.0
    tags: frozenset[str] = frozenset()  # what it is ("eu"): a team may require some
    cloud: Cloud = ""  # Anthropic's API as Vertex AI or Bedrock serves it; "": as it is
    rpm: int = 0  # its own requests and tokens per minute (deployment_limits.py); 0: none
    tpm: int = 0
    in_flight: int = 0  # this process's requests on it now
    down_until: float = 0.0

    def cooling(self, now: float) -> bool:
        return self.down_until > now

    @property
    def load(self) -> float:
        return self.in_flight / self.weight


class Deployments:
    def __init__(
        self,
        deployments: list[Deployment],
        guard: Guard,
        cooldown_s: float = 5.0,
        affinity_margin: float = 2.0,
        affinity_chars: int = 256,
        rng: random.Random | None = None,
        limits: DeploymentLimits | None = None,
    ) -> None:
        if not deployments:
            raise ValueError(f"{guard.name}: no deployments")
        self.all = deployments
        self.guard = guard
        self._cooldown_s = cooldown_s
        self._margin = affinity_margin
        self._chars = affinity_chars
        self._rng = rng or random.Random()
        self.limits = limits

    def allowed(self, tags: frozenset[str]) -> list[Deployment]:
        """The deployments that carry every one of a request's required tags."""
        found = [d for d in self.all if tags <= d.tags]
        if not found:  # the router routes such a team elsewhere: a catalog changed under it
            raise BackendUnavailable(
                503,
                f"model {self.guard.name!r} has no deployment your team may use",
                code="no_allowed_deployment",
            )
        return found

    def pick(
        self,
        tried: set[str] | None = None,
        tags: frozenset[str] = frozenset(),
        prefix: str = "",
        full: frozenset[str] = frozenset(),
    ) -> Deployment | None:
        """Of those carrying the request's tags and not `full` (at their limits this minute):
        those not tried for it and not cooling down, else those not cooling down, else the one
        back soonest; among them the prefix's home while its load allows, else by weight and
        load. None: every one is full."""
        now = time.monotonic()
        allowed = [d for d in self.allowed(tags) if d.name not in full]
        if not allowed:
            return None
        fresh = [d for d in allowed if d.name not in (tried or ()) and not d.cooling(now)]
        ready = fresh or [d for d in allowed if not d.cooling(now)]
        if not ready:
            return min(allowed, key=lambda d: d.down_until)
        if prefix and len(ready) > 1:
            key = prefix[: self._chars].encode()
            home = max(ready, key=lambda d: rendezvous(key, d.name, d.weight))
            if home.load <= min(d.load for d in ready) + self._margin:
                return home
        return min(ready, key=lambda d: (d.in_flight + self._rng.expovariate(1.0)) / d.weight)

    async def run(
        self, send: Callable[[Deployment], Awaitable[T]], call: UpstreamCall
    ) -> tuple[Deployment, T]:
        """`send` at one deployment after another (of those carrying the call's tags), within the
        model's tries; the deployment that answered counts the request as in flight until
        `release`."""
        tried: set[str] = set()
        tags = call.tags

        async def attempt() -> tuple[Deployment, T]:
            deployment = await self._take(call, tried)
            tried.add(deployment.name)
            deployment.in_flight += 1
            try:
                result = await send(deployment)
            except Retryable as exc:
                deployment.in_flight -= 1
                self._cool(deployment, exc.retry_after, exc.reason)
                DEPLOYMENT_REQUESTS.labels(self.guard.name, deployment.name, "retried").inc()
                now = time.monotonic()
                if any(d.name not in tried and not d.cooling(now) for d in self.allowed(tags)):
                    # another deployment can take it now: its wait is not this one's
                    raise Retryable(exc.reason, exc.status, 0.0) from exc
                raise
            except BaseException:
                deployment.in_flight -= 1
                raise
            DEPLOYMENT_REQUESTS.labels(self.guard.name, deployment.name, "answered").inc()
            return deployment, result

        return await self.guard.run(attempt, call.headers.get("x-tenant", ""))

    async def _take(self, call: UpstreamCall, tried: set[str]) -> Deployment:
        """The deployment the attempt goes to, counted against its own limits: one at them is
        passed over for the others; when all are, the model is rate limited until the next
        minute (its fallbacks take the request)."""
        full: set[str] = set()
        wait = 60
        while True:
            deployment = self.pick(tried, call.tags, call.prefix, frozenset(full))
            if deployment is None:
                raise BackendUnavailable(
                    429,
                    f"model {self.guard.name!r} is at its deployments' rate limits",
                    code="upstream_rate_limited",
                    retry_after=wait,
                )
            if self.limits is None or not (deployment.rpm or deployment.tpm):
                return deployment
            left = await self.limits.take(
                deployment.name, deployment.rpm, deployment.tpm, call.tokens
            )
            if not left:
                return deployment
            DEPLOYMENT_REQUESTS.labels(self.guard.name, deployment.name, "full").inc()
            full.add(deployment.name)
            wait = min(wait, left)

    async def reply(self, send: Callable[[Deployment], Awaitable[T]], call: UpstreamCall) -> T:
        """`run` for a whole reply: in flight only while it is read."""
        deployment, result = await self.run(send, call)
        self.release(deployment)
        return result

    def release(self, deployment: Deployment) -> None:
        deployment.in_flight -= 1

    def closer(
        self, deployment: Deployment, close: Callable[[], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        """A stream's close that also ends its share of the deployment's load."""

        async def closed() -> None:
            try:
                await close()
            finally:
                self.release(deployment)

        return closed

    def stream(
        self,
        deployment: Deployment,
        source: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        content_type: str = "text/event-stream",
    ) -> LiveStream:
        """A stream from it whose first bytes arrived: in flight until closed; a break after
        those bytes cools it."""
        closing = self.closer(deployment, close)
        return LiveStream(source, closing, lambda: self.broken(deployment), content_type)

    async def broken(self, deployment: Deployment) -> None:
        """A stream from it broke after its first byte."""
        self._cool(deployment, None, "a stream broke")
        now = time.monotonic()
        if not any(not d.cooling(now) for d in self.all):
            await self.guard.failed()

    def _cool(self, deployment: Deployment, retry_after: float | None, why: str) -> None:
        wait = min(COOLDOWN_MAX_S, self._cooldown_s if retry_after is None else retry_after)
        name = self.guard.name
        log.warning("%s at %s failed, skipped %.1fs: %s", name, deployment.name, wait, why)
        deployment.down_until = time.monotonic() + wait

    async def refresh(self) -> None:
        await self.guard.refresh()

    async def aclose(self) -> None:
        for deployment in self.all:
            await deployment.api.aclose()


class DeployedUpstream:
    """What every commercial backend is: a model at its deployments."""

    def __init__(self, info: ModelInfo, deployments: Deployments) -> None:
        self.info = info
        self.deployments = deployments

    def ping(self, at: Deployment, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        """The path and body of an OpenAI request (`path`, `body`) as `at` takes it."""
        raise NotImplementedError

    def refusal(self, status: int, raw: bytes) -> tuple[int, bytes]:
        """A refusal in OpenAI's shape (the provider's own, translated where it has another)."""
        return status, raw

    def refused(self, status: int, raw: bytes) -> UpstreamReply:
        """A refusal as the gateway's reply."""
        return UpstreamReply(*self.refusal(status, raw), "application/json")

    async def check(self, kind: str) -> list[Check]:
        """Each deployment tried once with the smallest request of `kind` (backends/checks.py)."""
        path, body = PINGS[kind]

        async def one(at: Deployment) -> Check:
            async def send() -> tuple[int, bytes]:
                reply = await at.api.post(*self.ping(at, path, body))
                return reply.status, self.refusal(reply.status, reply.body)[1]

            return await check(self.info.name, at.name, send)

        return list(await asyncio.gather(*(one(at) for at in self.deployments.all)))

    async def refresh(self) -> None:
        await self.deployments.refresh()

    async def aclose(self) -> None:
        await self.deployments.aclose()
