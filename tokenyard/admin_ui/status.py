"""Live status: each model's backend (readiness, circuit breaker), its engine replicas' load and
prefix-cache hit rate, its deployments (commercial models: requests this gateway process has in
flight at each, and which are skipped after a failure), and the platform's 429s by limit over the
last hour.

Replicas are asked directly (`/load`, `/metrics`) with a short timeout, so the page shows the
engines' state now, including `running`, which the gateway's own polling does not keep.
"""

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import RedisError

from tokenyard.backends.deployment_limits import DeploymentLimits
from tokenyard.gateway import refusals
from tokenyard.gateway.proxy import Proxy

_TIMEOUT_S = 1.0
_HITS = "tokenyard_engine_prefix_cache_hits_tokens_total"
_QUERIES = "tokenyard_engine_prefix_cache_queries_tokens_total"


@dataclass
class ReplicaStatus:
    url: str
    ok: bool = False
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_hit_rate: float | None = None  # share of looked-up prompt tokens found; None: unknown
    error: str = ""


@dataclass
class DeploymentStatus:
    name: str
    in_flight: int  # this gateway process's requests there now
    skipped_s: float  # how much longer it is passed over after a failure; 0: taking requests
    rpm: int = 0  # its own limits (0: none), and what every gateway counted this minute
    tpm: int = 0
    requests: int = 0
    tokens: int = 0


@dataclass
class ModelStatus:
    name: str
    provider: str
    ready: bool
    circuit: str
    replicas: list[ReplicaStatus] = field(default_factory=list)
    deployments: list[DeploymentStatus] = field(default_factory=list)


def hit_rate(metrics_text: str) -> float | None:
    """Prefix-cache hits over lookups, in tokens, since the engine started."""
    sums = {_HITS: 0.0, _QUERIES: 0.0}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums[_HITS] / sums[_QUERIES] if sums[_QUERIES] else None


async def _replica(client: httpx.AsyncClient, url: str) -> ReplicaStatus:
    status = ReplicaStatus(url)
    try:
        load = (await client.get(url + "/load")).raise_for_status().json()
    except (httpx.HTTPError, ValueError) as exc:
        status.error = type(exc).__name__
        return status
    total = load.get("total_blocks") or 0
    status.ok = True
    status.running = load.get("running", 0)
    status.waiting = load.get("waiting", 0)
    status.kv_usage = 1 - load.get("free_blocks", 0) / total if total else 0.0
    try:  # an engine without metrics still has a load
        response = await client.get(url + "/metrics")
        if response.status_code == 200:
            status.prefix_hit_rate = hit_rate(response.text)
    except httpx.HTTPError:
        pass
    return status


async def _counted(found: list[DeploymentStatus], limits: DeploymentLimits) -> None:
    """This minute's counts of the deployments that have limits of their own."""
    for d in found:
        if d.rpm or d.tpm:
            with contextlib.suppress(RedisError):  # the page shows what it can
                d.requests, d.tokens = await limits.used(d.name)


async def collect(proxy: Proxy) -> tuple[list[ModelStatus], dict[str, int]]:
    """Every configured model's status, and the 429s per limit code in the last hour."""
    models: list[ModelStatus] = []
    lookups = []
    async with httpx.AsyncClient(timeout=_TIMEOUT_S) as client:
        for name, upstream in sorted(proxy.backends.upstreams.items()):
            info = upstream.info
            model = ModelStatus(name, info.provider, info.ready, info.circuit)
            models.append(model)
            for replica in getattr(upstream, "replicas", ()):  # self-hosted engines only
                lookups.append((model, _replica(client, replica.url)))
            deployments = getattr(upstream, "deployments", None)  # commercial models only
            now = time.monotonic()
            model.deployments = [
                DeploymentStatus(d.name, d.in_flight, max(0.0, d.down_until - now), d.rpm, d.tpm)
                for d in (deployments.all if deployments else ())
            ]
            if deployments is not None and deployments.limits is not None:
                await _counted(model.deployments, deployments.limits)
        found = await asyncio.gather(*(lookup for _, lookup in lookups))
    for (model, _), replica in zip(lookups, found, strict=True):
        model.replicas.append(replica)
    return models, await refusals.last_hour(proxy.quotas.redis)
