"""Which of a route's candidates takes a request now: the first that is configured, ready, with
its circuit closed and not saturated. Skipping one for load or an open circuit is an overflow
(counted); a backend that fails before its first byte hands the request to the next usable one
(`Exchange.forward`), and none usable is a 503 with Retry-After."""

from dataclasses import dataclass

from tokenyard.backends.base import ModelInfo, Upstream
from tokenyard.backends.registry import Backends
from tokenyard.core.errors import GatewayError
from tokenyard.gateway import metrics
from tokenyard.router.policy import Route


@dataclass(frozen=True)
class Saturation:
    """When a self-hosted model counts as saturated: its least-loaded replica has this many
    requests queued, or this share of its KV cache in use (0: that test is off). Batch gives way at
    half the queue, so batch backlog never makes interactive traffic overflow."""

    max_waiting: int = 0
    max_kv_usage: float = 0.0

    def saturated(self, info: ModelInfo, tier: str) -> bool:
        limit = (self.max_waiting + 1) // 2 if tier == "batch" else self.max_waiting
        if limit and info.waiting >= limit:
            return True
        return bool(self.max_kv_usage) and info.kv_usage >= self.max_kv_usage


class Dispatch:
    def __init__(self, backends: Backends, saturation: Saturation) -> None:
        self.backends = backends
        self.saturation = saturation

    def _unusable(self, upstream: Upstream | None, tier: str) -> str | None:
        """Why this backend cannot take a request now (None: it can)."""
        if upstream is None:
            return "unconfigured"
        if upstream.info.circuit == "open" or not upstream.info.ready:
            return "down"
        if self.saturation.saturated(upstream.info, tier):
            return "saturated"
        return None

    def next_open(self, route: Route, tier: str, after: int) -> tuple[int, Upstream] | None:
        """The next candidate of the route, from index `after`, that can take the request;
        candidates skipped for load or an open circuit count as overflow."""
        for i in range(after, len(route.candidates)):
            upstream = self.backends.get(route.candidates[i])
            why = self._unusable(upstream, tier)
            if why is None:
                assert upstream is not None
                return i, upstream
            if why != "unconfigured":
                metrics.OVERFLOWS.labels(route.candidates[i], why).inc()
        return None

    def first_usable(self, route: Route, tier: str) -> Upstream:
        """The backend that takes the request: the route's first usable candidate, or a 503."""
        found = self.next_open(route, tier, 0)
        if found is not None:
            return found[1]
        infos = [u.info for m in route.candidates if (u := self.backends.get(m))]
        up = [i for i in infos if i.ready and i.circuit != "open"]
        if up:  # the shortest queue among those up: a down one's says nothing of the wait
            queued = min(i.waiting for i in up)
            raise GatewayError(
                503,
                f"model {route.candidates[0]!r} and its fallbacks are saturated ({queued} "
                "requests queued)",
                code="upstream_saturated",
                retry_after=1,
            )
        raise GatewayError(
            503,
            f"model {route.candidates[0]!r} and its fallbacks are not ready",
            code="model_not_ready",
            retry_after=1,
        )
