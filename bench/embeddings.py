"""Embeddings per second of all-MiniLM-L6-v2: sentence-transformers' own `encode`, the embeddings
server's model path called directly (embeddings/model.py: tokenize + one forward pass), and the
embeddings server over HTTP (`tokenyard embeddings`, dynamic batching) with as many concurrent
clients as the batch size, each sending one input per request. All in one run, on one machine.

    .venv/bin/python bench/embeddings.py [--texts 256] [--batches 1,4,16,64] [--threads N]

The texts are sentences of 8 to 64 words, drawn with a fixed seed. Prints a markdown table.
"""

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parent.parent
# run as a script, this file's folder comes first on the path and its name would shadow the
# `embeddings` package it measures
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(ROOT)
WORDS = (
    "the model serves requests from many teams while the gateway keeps quotas in redis and "
    "routes each prompt to a cheaper or stronger backend depending on how hard it looks some "
    "questions ask for code others for summaries of long reports about revenue rivers cats "
    "weather travel science history music and the price of tokens per million"
).split()


def texts(count: int) -> list[str]:
    rng = random.Random(19)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 64))) for _ in range(count)]


def rate(run: Callable[[list[str]], object], items: list[str], batch: int) -> float:
    """Embeddings per second over `items`, `batch` at a time (one warm-up batch first)."""
    run(items[:batch])
    started = time.perf_counter()
    for start in range(0, len(items), batch):
        run(items[start : start + batch])
    return len(items) / (time.perf_counter() - started)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def server_rate(url: str, items: list[str], clients: int) -> float:
    """Embeddings per second through the server: `clients` concurrent single-input requests."""
    queue = list(items)

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            text = queue.pop()
            body = {"model": "all-minilm-l6-v2", "input": text, "encoding_format": "base64"}
            reply = await http.post(url + "/v1/embeddings", json=body)
            reply.raise_for_status()

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await http.post(url + "/v1/embeddings", json={"model": "m", "input": items[0]})
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return len(items) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256, help="texts per measurement")
    parser.add_argument("--batches", default="1,4,16,64", help="batch sizes (comma-separated)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--no-server", action="store_true", help="skip the HTTP server rows")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from tokenyard.core.minilm import minilm_dir
    from tokenyard.embeddings.model import MiniLM

    items = texts(args.texts)
    batches = [int(b) for b in args.batches.split(",")]
    reference = SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)
    ours = MiniLM()
    ours_name = "tokenyard/embeddings/model.py"
    rows: dict[str, list[float]] = {"sentence-transformers encode": [], ours_name: []}
    for batch in batches:
        rows["sentence-transformers encode"].append(
            rate(lambda b, n=batch: reference.encode(b, batch_size=n), items, batch)
        )
        rows[ours_name].append(rate(lambda b: ours.encode(ours.tokenize(b)), items, batch))
    if not args.no_server:
        port = free_port()
        command = [sys.executable, "-c", "from tokenyard.cli import main; main()", "embeddings"]
        env = dict(os.environ)
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)
        server = subprocess.Popen([*command, "--port", str(port)], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.3)
            name = "server, N clients × 1 input (HTTP, dynamic batching)"
            rows[name] = [asyncio.run(server_rate(url, items, batch)) for batch in batches]
        finally:
            server.terminate()
            server.wait()
    print(f"torch threads: {torch.get_num_threads()}, texts: {len(items)}\n")
    print("| embeddings/s | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:.0f}" for v in values) + " |")


if __name__ == "__main__":
    main()
