"""How long `tokenyard engine` takes from its start to answering /health, on a data dir it has
never used (the GGUF's tokenizer converted) and again on the same one (the converted tokenizer
read back), in a fresh process each run; with llama.cpp's `llama-server` on the same GGUF where
bench/engine_vs_llamacpp.py has built it (var/llamacpp). Prints each start and the medians.

    .venv/bin/python bench/engine_startup.py [--runs 3] [--root PATH] [--llamacpp-args=--no-repack]

`--root`: another checkout to measure (its packages first on the path), for a before/after.
"""

import argparse
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
from engine_vs_llamacpp import CACHE, cpu_flags

from tokenyard.engine.loader import resolve_model_path

LLAMA_SERVER = CACHE / "build" / "bin" / "llama-server"  # where engine_vs_llamacpp.py builds it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_health(
    command: list[str], port: int, env: dict[str, str], cwd: str | None = None
) -> float:
    started = time.perf_counter()
    out = subprocess.DEVNULL
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=out)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait()


def engine_start(data_dir: str, root: str | None) -> float:
    port = _free_port()
    env = {**os.environ, "TOKENYARD_DATA_DIR": data_dir}
    if root:
        env["PYTHONPATH"] = os.path.abspath(root)
    run = "from tokenyard.cli import main; main()"
    command = [sys.executable, "-c", run, "engine", "--model", "smollm2", "--port", str(port)]
    # in the checkout measured: `python -c` puts the working directory first on the path
    return time_to_health([*command, "--num-blocks", "128"], port, env, cwd=root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", default=None, help="checkout to measure (default: this one)")
    parser.add_argument(
        "--llamacpp-args",
        default="",
        help="more llama-server arguments (on AMX CPUs the native build dies in its warm-up "
        "unless given --no-repack, as in bench/engine_vs_llamacpp.py)",
    )
    args = parser.parse_args()
    print(f"CPU: {cpu_flags()}")
    times: dict[str, list[float]] = {"new data dir": [], "same data dir": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as data_dir:
            for kind in times:
                times[kind].append(engine_start(data_dir, args.root))
                print(f"tokenyard engine, {kind}: {times[kind][-1]:.2f} s", flush=True)
    if LLAMA_SERVER.exists():
        port = _free_port()
        command = [str(LLAMA_SERVER), "-m", resolve_model_path("smollm2"), "--port", str(port)]
        command += shlex.split(args.llamacpp_args)
        times["llama-server"] = [time_to_health(command, port, dict(os.environ))]
        print(f"llama-server: {times['llama-server'][-1]:.2f} s")
    for kind, seconds in times.items():
        print(f"median of {len(seconds)}, {kind}: {statistics.median(seconds):.2f} s")


if __name__ == "__main__":
    main()
