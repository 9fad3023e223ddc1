"""Complexity classifier: single-prompt scoring latency, and its held-out quality vs baselines.

    .venv/bin/python bench/router_latency.py [--n 3000]

Latency is one `ComplexityClassifier.score(prompt)` call at a time (what the router does per
request), over held-out MMLU and GSM8K test prompts in their natural length mix plus MT-Bench
first turns; scikit-learn's own `predict_proba` on one prompt is timed alongside for reference.
Quality is read from the evaluation report written by `tokenyard router train`.
"""

import argparse
import json
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from router.classifier import DEFAULT_ARTIFACT, ComplexityClassifier
from router.train import TrainConfig, load_data


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="prompts to time")
    args = parser.parse_args()

    clf = ComplexityClassifier.load(DEFAULT_ARTIFACT)
    cfg = clf.metadata["config"]
    data = load_data(
        TrainConfig(seed=cfg["seed"], val_frac=cfg["val_frac"], test_frac=cfg["test_frac"])
    )
    pool = [e.prompt for e in data.part("test")] + [q.first_turn for q in data.mt_bench]
    rng = np.random.default_rng(0)
    prompts = [pool[i] for i in rng.choice(len(pool), args.n, replace=args.n > len(pool))]
    lengths = np.array([len(p) for p in prompts])

    _time(clf.score, prompts[:200])  # warm caches and the allocator
    fast_wall, fast_cpu = _time(clf.score, prompts)
    pipe_wall, pipe_cpu = _time(lambda p: clf.pipeline.predict_proba([p]), prompts[:300])

    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, python {platform.python_version()}")
    print(
        f"prompts: {len(prompts)} held-out, chars p50 {np.percentile(lengths, 50):.0f} "
        f"p99 {np.percentile(lengths, 99):.0f} max {lengths.max()}"
    )
    load = os.getloadavg()[0]
    print(f"load average (1 min) during the run: {load:.2f} on {os.cpu_count()} cores")
    print(f"ComplexityClassifier.score, wall:      {_percentiles(fast_wall)}")
    print(f"ComplexityClassifier.score, CPU time:  {_percentiles(fast_cpu)}")
    print(f"sklearn predict_proba (reference), wall: {_percentiles(pipe_wall)}")
    print(f"sklearn predict_proba (reference), CPU:  {_percentiles(pipe_cpu)}")

    report = json.loads(
        DEFAULT_ARTIFACT.with_name(DEFAULT_ARTIFACT.stem + "-report.json").read_text()
    )
    print()
    print("| held-out set | router | APGR [95% CI] | CPT(50%) [95% CI] | AUROC weak fails |")
    print("|---|---|---|---|---|")
    for name, section in report["evaluations"].items():
        for router, m in section["routers"].items():
            auroc = m["auroc_weak_fails"]["value"]
            print(
                f"| {name} (n={section['n']}) | {router} | {m['apgr']['value']:.3f} "
                f"[{m['apgr']['low']:.3f}, {m['apgr']['high']:.3f}] | "
                f"{m['cpt50']['value']:.1%} [{m['cpt50']['low']:.1%}, {m['cpt50']['high']:.1%}] | "
                + ("—" if auroc is None else f"{auroc:.3f}")
                + " |"
            )


if __name__ == "__main__":
    main()
