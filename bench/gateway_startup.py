"""What a gateway process costs before its first request: importing the app and loading both
classifiers (the router's and the guard's), as `tokenyard/app.py`'s startup does, in a fresh
interpreter each run. Prints each run's wall time and peak resident memory, and the medians.

    .venv/bin/python bench/gateway_startup.py [--runs 5] [--root PATH]

`--root`: another checkout to measure (its packages first on the path), for a before/after.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = """
import json, resource, sys, time
started = time.perf_counter()
import tokenyard.app
from tokenyard.guard.classifier import SafetyClassifier
from tokenyard.router.classifier import ComplexityClassifier
ComplexityClassifier.load()
SafetyClassifier.load()
print(json.dumps({
    "seconds": time.perf_counter() - started,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "sklearn": "sklearn" in sys.modules,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--root", default=None, help="checkout to measure (default: this one)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.root:
        env["PYTHONPATH"] = os.path.abspath(args.root)
    runs = []
    for _ in range(args.runs):
        done = subprocess.run(
            [sys.executable, "-c", PROBE],
            env=env,
            cwd=args.root or None,
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]))
    seconds = statistics.median(r["seconds"] for r in runs)
    rss = statistics.median(r["rss_mib"] for r in runs)
    print(f"median of {len(runs)}: {seconds:.2f} s, {rss:.0f} MiB peak RSS")


if __name__ == "__main__":
    main()
