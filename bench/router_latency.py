"""The router: decision latency of the whole routing path, the classifier's own scoring latency,
and its held-out quality vs baselines.

    .venv/bin/python bench/router_latency.py [--n 3000]

The whole path is what the gateway runs per request before it reserves quotas: the policy (catalog
lookup, the team's threshold, the classifier's score for model="auto") and the choice of the first
usable candidate (readiness, breaker state, engine load), over the shipped catalog with every model
configured, in three states: all healthy; the cheap engine saturated (overflow to its fallback); the
strong model's breaker open (its fallback takes it).

Latency is one `ComplexityClassifier.route_score(prompt)` call at a time (what the router does
per request), over the test parts of every domain in their natural length mix plus MT-Bench first
turns, and separately over long prompts: held-out prompts joined up to 1k, 2k, 4k and 8k
MiniLM tokens (the scorer embeds only the first and last 1,000 characters of a long prompt).
Quality is read from the evaluation report written by `tokenyard router train`.
"""

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np
from redis.asyncio import Redis

from tokenyard.core.settings import Settings
from tokenyard.gateway.dispatch import Dispatch, Saturation
from tokenyard.router.catalog import DEFAULT_CATALOG, Catalog
from tokenyard.router.classifier import DEFAULT_ARTIFACT, ComplexityClassifier
from tokenyard.router.policy import AUTO, Router, Scorer
from tokenyard.router.training.dataset import load_domains, random_split
from tokenyard.router.upstreams import build_backends
from tokenyard.tenancy.policy import TeamPolicy


def _percentiles(seconds: list[float]) -> str:
    ms = np.array(seconds) * 1e3
    p50, p99 = np.percentile(ms, [50, 99])
    return f"p50 {p50:.3f} ms, p99 {p99:.3f} ms, max {ms.max():.3f} ms"


def _time(fn: Callable[[str], object], prompts: list[str]) -> tuple[list[float], list[float]]:
    """Wall and thread-CPU seconds per call. On a shared machine the wall time also holds the
    moments another process had the core; the CPU time is the scorer's own cost."""
    wall, cpu = [], []
    for p in prompts:
        c, t = time.thread_time(), time.perf_counter()
        fn(p)
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    return wall, cpu


def _long_prompts(
    clf: ComplexityClassifier, pool: list[str], tokens: int, rng: np.random.Generator, n: int = 300
) -> list[str]:
    """n prompts of held-out text joined until they hold `tokens` MiniLM tokens (as the
    tokenizer counts the whole text, not the scorer's edges)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(clf.scorer.pieces.tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    out = []
    for _ in range(n):
        parts: list[str] = []
        while len(tokenizer.encode("\n\n".join(parts)).ids) < tokens:
            parts += [pool[i] for i in rng.choice(len(pool), 8)]
        out.append("\n\n".join(parts))
    return out


def _routing_path(clf: ComplexityClassifier) -> tuple[Router, Dispatch]:
    """A gateway's routing half over the shipped catalog, every model configured and ready: the
    router and the dispatch the gateway's Proxy holds; no quota store or auth is on this path."""
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        os.environ.setdefault(var, "sk-bench")
    settings = Settings(gateway_max_upstream_waiting=8, router_max_kv_usage=0.95)
    catalog = Catalog.load(DEFAULT_CATALOG, "smollm2=http://127.0.0.1:1,smollm2=http://127.0.0.1:2")
    redis = Redis()  # never connected: breaker state is read from the process's copy
    backends = build_backends(catalog, redis, settings)
    for upstream in backends.upstreams.values():
        upstream.info.ready = True
    saturation = Saturation(settings.gateway_max_upstream_waiting, settings.router_max_kv_usage)
    return Router(catalog, Scorer(lambda: clf)), Dispatch(backends, saturation)


def _time_routing(path: tuple[Router, Dispatch], prompts: list[str]) -> dict[str, list[float]]:
    router, dispatch = path
    share = TeamPolicy(team="bench", strong_share=0.3)
    bar = TeamPolicy(team="bench", auto_quality=0.8)  # the cost-aware choice
    states = {
        "all healthy": (lambda b: None, share),
        "all healthy, quality bar 0.8": (lambda b: None, bar),
        "cheap engine saturated": (lambda b: setattr(b["smollm2"].info, "waiting", 50), share),
        "strong breaker open": (lambda b: setattr(b["gpt-4o"].info, "circuit", "open"), share),
    }
    out: dict[str, list[float]] = {}
    served: dict[str, set[str]] = {}
    for name, (apply, team) in states.items():
        apply(dispatch.backends.upstreams)

        def decide(prompt: str, team: TeamPolicy = team) -> str:
            body = {"model": AUTO, "messages": [{"role": "user", "content": prompt}]}
            route = router.route(AUTO, body, team, "interactive")
            return dispatch.first_usable(route, "interactive").info.name

        out[name], _ = _time(decide, prompts)
        served[name] = {decide(p) for p in prompts[:300]}
    for name, models in served.items():
        print(f"  {name}: served by {sorted(models)}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="prompts to time")
    args = parser.parse_args()

    clf = ComplexityClassifier.load(DEFAULT_ARTIFACT)
    cfg = clf.metadata["config"]
    pool = []
    for name, rows in load_domains().items():
        if name == "mt_bench":
            pool += [r.prompt for r in rows]
            continue
        split = random_split(rows, cfg["seed"], cfg["val_frac"], cfg["test_frac"])
        pool += [rows[i].prompt for i in split.test]
    rng = np.random.default_rng(0)
    prompts = [pool[i] for i in rng.choice(len(pool), args.n, replace=args.n > len(pool))]
    lengths = np.array([len(p) for p in prompts])
    long = {tokens: _long_prompts(clf, pool, tokens, rng) for tokens in (1024, 2048, 4096, 8192)}

    _time(clf.route_score, prompts[:200])  # warm caches and the allocator
    print("whole routing path (model=auto, policy + candidate choice):")
    routing = _time_routing(_routing_path(clf), prompts)
    fast_wall, fast_cpu = _time(clf.route_score, prompts)

    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, python {platform.python_version()}")
    print(
        f"prompts: {len(prompts)} held-out, chars p50 {np.percentile(lengths, 50):.0f} "
        f"p99 {np.percentile(lengths, 99):.0f} max {lengths.max()}"
    )
    load = os.getloadavg()[0]
    print(f"load average (1 min) during the run: {load:.2f} on {os.cpu_count()} cores")
    print(f"route_score, wall:      {_percentiles(fast_wall)}")
    print(f"route_score, CPU time:  {_percentiles(fast_cpu)}")
    for tokens, batch in long.items():
        wall, cpu = _time(clf.route_score, batch)
        print(f"route_score, ~{tokens} tokens, wall: {_percentiles(wall)}; CPU {_percentiles(cpu)}")
        long_route = _time_routing(_routing_path(clf), batch[:100])["all healthy"]
        print(f"routing path, ~{tokens} tokens, all healthy, wall: {_percentiles(long_route)}")
    for name, wall in routing.items():
        print(f"routing path, {name}, wall: {_percentiles(wall)}")

    report = json.loads(
        DEFAULT_ARTIFACT.with_name(DEFAULT_ARTIFACT.stem + "-report.json").read_text()
    )
    print()
    print("| held out (leave one domain out) | router | APGR [95% CI] | CPT(50%) [95% CI] |")
    print("|---|---|---|---|")
    for name, section in report["evaluations"]["lodo"].items():
        for router, m in section["routers"].items():
            print(
                f"| {name} (n={section['n']}) | {router} | {m['apgr']['value']:.3f} "
                f"[{m['apgr']['low']:.3f}, {m['apgr']['high']:.3f}] | "
                f"{m['cpt50']['value']:.1%} [{m['cpt50']['low']:.1%}, {m['cpt50']['high']:.1%}] |"
            )


if __name__ == "__main__":
    main()
