"""Batch interference: interactive time-to-first-token with and without a large batch job running
through the gateway on the same engine, and the batch job's throughput on the spare capacity.

The real engine (`tokenyard engine`, SmolLM2 on CPU) behind one gateway with Redis and SQLite.
Interactive traffic is open-loop: one streamed chat request every --interval seconds (the same
arrivals in both phases), TTFT measured at the client through the gateway. Phase 1 runs it alone;
phase 2 first submits a batch job of --batch-requests requests through the Files and Batches API
(the batch tier: preemptible in the engine, started only while the engine has room), waits until
the job is running, then replays the same interactive traffic, then waits for the job to finish.

    .venv/bin/python bench/batch_interference.py [--interactive 40] [--interval 1.5]
        [--batch-requests 256] [--batch-max-tokens 64]

Prints a markdown table: TTFT p50/p99 alone and with batch, their ratio (target: p99 ≤ 1.5×), and
the batch job's output tokens/s over its run and while the interactive traffic ran.
"""

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import REDIS_SERVER, free_port, process, wait_http

MODEL = "smollm2"
TOKENYARD = [sys.executable, "-c", "from tokenyard.cli import main; main()"]


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def interactive(url: str, key: str, count: int, interval: float, max_tokens: int) -> list:
    """TTFTs of `count` streamed requests started every `interval` seconds."""
    ttfts: list[float] = []
    headers = {"authorization": f"Bearer {key}", "x-tier": "interactive"}
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=headers) as http:

        async def one(i: int) -> None:
            await asyncio.sleep(i * interval)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Question {i}: name a colour."}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }
            sent = time.perf_counter()
            async with http.stream("POST", "/v1/chat/completions", json=body) as reply:
                reply.raise_for_status()
                first = None
                async for line in reply.aiter_lines():  # to the end: the answer is read whole
                    if first is None and line.startswith("data: {"):
                        choices = json.loads(line[6:])["choices"]
                        if choices and choices[0]["delta"].get("content"):
                            first = time.perf_counter() - sent
                assert first is not None, "no content streamed"
                ttfts.append(first)

        await asyncio.gather(*(one(i) for i in range(count)))
    return ttfts


def submit_batch(client: openai.OpenAI, n: int, max_tokens: int) -> str:
    lines = []
    for i in range(n):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Write a short story about the number {i}."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        item = {"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        lines.append(json.dumps(item))
    uploaded = client.files.create(file=("bench.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interactive", type=int, default=40, help="interactive requests a phase")
    parser.add_argument("--interval", type=float, default=1.5, help="seconds between them")
    parser.add_argument("--interactive-max-tokens", type=int, default=16)
    parser.add_argument("--batch-requests", type=int, default=256)
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    parser.add_argument("--max-seqs", type=int, default=64)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ty-bench-"))
    ports = {name: free_port() for name in ("redis", "engine", "gateway")}
    env = {
        **os.environ,
        "TOKENYARD_DATA_DIR": str(tmp),
        "TOKENYARD_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}",
        "TOKENYARD_ENGINE_URLS": f"{MODEL}=http://127.0.0.1:{ports['engine']}",
        "TOKENYARD_BATCH_POLL_S": "0.2",
    }
    url = f"http://127.0.0.1:{ports['gateway']}"
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        stack.enter_context(process([str(REDIS_SERVER), "--port", str(ports["redis"])]))
        engine = [*TOKENYARD, "engine", "--port", str(ports["engine"]), "--device", "cpu"]
        stack.enter_context(process([*engine, "--max-seqs", str(args.max_seqs)], env))
        wait_http(f"http://127.0.0.1:{ports['engine']}/health", timeout=600)
        subprocess.run([*TOKENYARD, "teams", "create", "bench"], env=env, check=True)
        made = subprocess.run(
            [*TOKENYARD, "keys", "create", "--team", "bench"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        key = made.stdout.strip().splitlines()[-1]
        stack.enter_context(process([*TOKENYARD, "gateway", "--port", str(ports["gateway"])], env))
        wait_http(url + "/ready", timeout=120)
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=600)

        def run_interactive() -> list[float]:
            return asyncio.run(
                interactive(url, key, args.interactive, args.interval, args.interactive_max_tokens)
            )

        asyncio.run(interactive(url, key, 2, 0, 4))  # warm-up: first-request costs
        alone = run_interactive()

        batch_id = submit_batch(client, args.batch_requests, args.batch_max_tokens)
        while (before := client.batches.retrieve(batch_id).request_counts.completed) == 0:
            time.sleep(0.5)  # the job is running (and the engine full of it) before we measure
        started = time.perf_counter()
        loaded = run_interactive()
        phase_s = time.perf_counter() - started
        during = client.batches.retrieve(batch_id).request_counts.completed
        while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "expired"):
            time.sleep(1)
        output = client.files.content(batch.output_file_id).content.splitlines()
        tokens = sum(
            json.loads(raw)["response"]["body"]["usage"]["completion_tokens"] for raw in output
        )
        seconds = (batch.completed_at or batch.expired_at or 0) - (batch.in_progress_at or 0)

    p50a, p99a, p50b, p99b = pct(alone, 50), pct(alone, 99), pct(loaded, 50), pct(loaded, 99)
    print(f"\nbatch {batch.status}: {len(output)}/{args.batch_requests} requests answered,")
    print(f"{during} of them by the end of the interactive phase (< all: it overlapped)")
    # ignore_eos: every batch request produces exactly --batch-max-tokens tokens
    shared = (during - before) * args.batch_max_tokens / phase_s
    print(f"batch output while interactive ran: {shared:.1f} tok/s over {phase_s:.0f} s\n")
    print("| run | TTFT p50 | TTFT p99 |")
    print("|---|---|---|")
    print(f"| interactive alone | {p50a * 1000:.0f} ms | {p99a * 1000:.0f} ms |")
    print(f"| interactive + batch job | {p50b * 1000:.0f} ms | {p99b * 1000:.0f} ms |")
    print(f"| ratio | {p50b / p50a:.2f}× | **{p99b / p99a:.2f}×** (target ≤ 1.5×) |")
    rate = tokens / max(seconds, 1)
    print(f"\nbatch job: {tokens} output tokens in {seconds} s = {rate:.1f} tok/s")


if __name__ == "__main__":
    main()
