"""Engine throughput and latency against transformers `generate`, on one seeded workload.

64 chat requests (prompts 30-600 tokens, outputs 16-256 tokens long-tailed, EOS ignored, greedy)
run through (a) the engine in-process, (b) the engine over HTTP at full concurrency, (c)
transformers one request at a time and (d) in static batches of 8. The engine runs its default
dtype (bf16 where the CPU has bf16 dot products) and, for a like-for-like row, fp32; transformers
runs both dtypes, and the best of its four runs is the baseline. A second workload gives every
request the same ~500-token system prompt (and 30-100 tokens of its own) and compares TTFT with
prefix caching on and off.
Before that, the script measures this machine's matmul rate (in the engine's dtype) and memory
bandwidth and derives the workload's compute floor: prefill FLOPs at the matmul rate plus one read
of the weights per generated token at the memory bandwidth; and a stricter one with one read per
decode step (all sequences batched, as many steps as the longest output).

    .venv/bin/python bench/engine_throughput.py [--requests 64] [--skip-transformers]
"""

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time

import httpx
import torch

from tokenyard.engine.async_engine import AsyncEngine
from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.loader import resolve_model_path
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

WORDS = (
    "the model serves many teams at once while a scheduler shares the cache fairly between "
    "requests that arrive in bursts and leave whenever their answers are complete so memory "
    "returns to the pool quickly and waiting work starts sooner than it otherwise would"
).split()


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


# ---------------------------------------------------------------- workload


def make_workload(tokenizer, n: int, seed: int, shared_system: str | None):
    """Prompts of 30-600 tokens; with a shared ~500-token system prompt, the user part is what
    is left of that: 30-100 tokens."""
    rng = random.Random(seed)
    work = []
    for i in range(n):
        target = rng.randint(30, 100) if shared_system else rng.randint(30, 600)
        words = [rng.choice(WORDS) for _ in range(target)]
        text = f"Request {i}: " + " ".join(words)
        ids = tokenizer.encode(text)[: max(1, target - 30)]
        content = tokenizer.decode(ids)
        messages = [{"role": "user", "content": content}]
        if shared_system:
            messages.insert(0, {"role": "system", "content": shared_system})
        out_len = int(min(256, max(16, rng.lognormvariate(3.7, 0.8))))
        work.append((messages, tokenizer.apply_chat_template(messages), out_len))
    return work


def system_prompt(tokenizer, tokens: int = 500) -> str:
    rng = random.Random(7)
    text = "You are the assistant of a large company. " + " ".join(
        rng.choice(WORDS) for _ in range(tokens)
    )
    return tokenizer.decode(tokenizer.encode(text)[:tokens])


# ---------------------------------------------------------------- machine floor


def machine_rates(dtype: torch.dtype) -> tuple[float, float]:
    """Matmul GFLOP/s on model-like shapes in `dtype`, and memory bandwidth in GB/s (copy)."""
    a, b = torch.randn(512, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ b
    reps, start = 50, time.perf_counter()
    for _ in range(reps):
        a @ b
    gflops = 2 * 512 * 576 * 1536 * reps / (time.perf_counter() - start) / 1e9
    src = torch.randn(64 * 2**20 // 4 * 4)  # 256 MiB
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps, start = 5, time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    gbps = 2 * src.numel() * 4 * reps / (time.perf_counter() - start) / 1e9
    return gflops, gbps


def floor_tokens_per_s(engine: LLMEngine, work, gflops: float, gbps: float) -> tuple[float, float]:
    """Output tokens/s if prefill ran at the matmul rate and decoding were bound by weight reads:
    (one read per generated token, as a server running one request at a time pays;
     one read per decode step with every sequence batched, as many steps as the longest output)."""
    cfg = engine.model_config  # sizes from the config: the engine may hold weights repacked
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    hidden = cfg.hidden_size
    linear = cfg.num_layers * (hidden * (2 * q + 2 * kv) + 3 * hidden * cfg.intermediate_size)
    prefill_flops = 0.0
    for _, ids, _ in work:
        n = len(ids)
        attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * n * n / 2
        prefill_flops += 2 * linear * n + attention
    prefill = prefill_flops / (gflops * 1e9)
    # every layer's projections and norms, the final norm and the LM head
    weights = (linear + (2 * cfg.num_layers + 1) * hidden + cfg.vocab_size * hidden) * (
        engine.runner.dtype.itemsize
    )
    weight_read = weights / (gbps * 1e9)
    tokens = sum(n for _, _, n in work)
    per_token = tokens / (prefill + tokens * weight_read)
    batched = tokens / (prefill + max(n for _, _, n in work) * weight_read)
    return per_token, batched


# ---------------------------------------------------------------- runs


def summary(name: str, tokens: int, seconds: float, ttfts: list[float], itls: list[float]) -> dict:
    row = {
        "run": name,
        "tok/s": tokens / seconds,
        "ttft_p50": pct(ttfts, 0.5),
        "ttft_p99": pct(ttfts, 0.99),
        "itl_p50": pct(itls, 0.5),
        "itl_p99": pct(itls, 0.99),
        "rss_gib": rss_gib(),
    }
    print(
        f"{name:<34} {row['tok/s']:8.1f} tok/s  TTFT p50 {row['ttft_p50']:7.3f}s p99 "
        f"{row['ttft_p99']:7.3f}s  ITL p50 {row['itl_p50'] * 1e3:7.1f}ms p99 "
        f"{row['itl_p99'] * 1e3:7.1f}ms  peak RSS {row['rss_gib']:.2f} GiB",
        flush=True,
    )
    return row


def run_engine(engine: LLMEngine, work, name: str) -> dict:
    """The server's layout: the step loop on the main thread, the clients' event loop in another."""
    aengine = AsyncEngine(engine)
    stats, elapsed = [], []

    async def clients():
        async def one(i, ids, out_len):
            params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
            async for out in aengine.generate(GenerationRequest(f"{name}-{i}", ids, params)):
                if out.stats:
                    stats.append(out.stats)

        start = time.perf_counter()
        await asyncio.gather(*(one(i, ids, n) for i, (_, ids, n) in enumerate(work)))
        elapsed.append(time.perf_counter() - start)

    thread = threading.Thread(target=asyncio.run, args=(clients(),))
    thread.start()
    aengine.run(until=lambda: not thread.is_alive())
    tokens = sum(s.completion_tokens for s in stats)
    return summary(
        name, tokens, elapsed[0], [s.ttft for s in stats], [g for s in stats for g in s.token_gaps]
    )


def run_http(work, name: str, port: int, extra_args: list[str]) -> dict:
    tokenyard = os.path.join(os.path.dirname(sys.executable), "tokenyard")
    cmd = [tokenyard, "engine", "--port", str(port), *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)

        async def main():
            ttfts, itls, tokens = [], [], 0
            limits = httpx.Limits(max_connections=len(work))
            async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as http:

                async def one(messages, out_len):
                    nonlocal tokens
                    body = {
                        "model": "smollm2",
                        "messages": messages,
                        "max_tokens": out_len,
                        "temperature": 0,
                        "ignore_eos": True,
                        "stream": True,
                    }
                    sent = time.perf_counter()
                    last = None
                    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if not line.startswith("data: {"):
                                continue
                            choices = json.loads(line[6:])["choices"]
                            if not choices or not choices[0]["delta"].get("content"):
                                continue  # the role chunk, the finish chunk
                            now = time.perf_counter()
                            if last is None:
                                ttfts.append(now - sent)
                            else:
                                itls.append(now - last)
                            last = now
                            tokens += 1

                start = time.perf_counter()
                await asyncio.gather(*(one(m, n) for m, _, n in work))
                return tokens, time.perf_counter() - start, ttfts, itls

        tokens, elapsed, ttfts, itls = asyncio.run(main())
        return summary(name, tokens, elapsed, ttfts, itls)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_transformers(model, work, batch: int, name: str) -> dict:
    """Static batches (left-padded) generate until the batch's longest output; one at a time: 1."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Tick(LogitsProcessor):
        """Called once per decoding step (the whole batch's): a timestamp per generated token."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, ids, scores):
            self.times.append(time.perf_counter())
            return scores

    ttfts, itls, tokens = [], [], 0
    start = time.perf_counter()
    pad = 2
    with torch.inference_mode():
        for b in range(0, len(work), batch):
            group = work[b : b + batch]
            width = max(len(ids) for _, ids, _ in group)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids, _ in group])
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids, _ in group])
            longest = max(n for _, _, n in group)
            tick = Tick()
            model.generate(
                input_ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                do_sample=False, pad_token_id=pad, logits_processor=LogitsProcessorList([tick]),
            )  # fmt: skip
            ttfts += [tick.times[0] - start] * len(group)  # every request arrived at the start
            itls += [b - a for a, b in itertools.pairwise(tick.times)] * len(group)
            tokens += sum(n for _, _, n in group)  # only the tokens each request asked for
    return summary(name, tokens, time.perf_counter() - start, ttfts, itls)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--port", type=int, default=8197)
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    config = EngineConfig(device="cpu", kv_cache_gib=args.kv_cache_gib, max_num_seqs=args.requests)
    engine = LLMEngine(config)
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    gflops, gbps = machine_rates(engine.runner.dtype)
    print(f"machine: {dtype} matmul {gflops:.1f} GFLOP/s, memory copy {gbps:.1f} GB/s")
    print(f"engine: {dtype}, attention {type(engine.runner.attention).__name__}")
    tokenizer = engine.tokenizer
    work = make_workload(tokenizer, args.requests, args.seed, None)
    floor, floor_batched = floor_tokens_per_s(engine, work, gflops, gbps)
    print(
        f"workload: {len(work)} requests, {sum(len(i) for _, i, _ in work)} prompt tokens, "
        f"{sum(n for _, _, n in work)} output tokens; compute floor {floor:.1f} tok/s "
        f"(one weight read per token), {floor_batched:.1f} tok/s (per batched decode step)"
    )
    ours = run_engine(engine, work, f"engine ({dtype}, in-process)")["tok/s"]
    http_args = ["--kv-cache-gib", str(args.kv_cache_gib), "--max-seqs", str(args.requests)]
    http = run_http(work, "engine (HTTP, full concurrency)", args.port, http_args)["tok/s"]

    shared = make_workload(tokenizer, args.requests, args.seed + 1, system_prompt(tokenizer))
    cached = run_engine(engine, shared, "shared prefix, prefix cache on")
    del engine
    off = LLMEngine(EngineConfig(**{**vars(config), "enable_prefix_caching": False}))
    uncached = run_engine(off, shared, "shared prefix, prefix cache off")
    del off

    hf: dict[str, float] = {}
    if not args.skip_transformers:
        fp32 = LLMEngine(EngineConfig(**{**vars(config), "dtype": "float32"}))
        hf["engine float32"] = run_engine(fp32, work, "engine (float32, in-process)")["tok/s"]
        del fp32
        from transformers import AutoModelForCausalLM

        path = resolve_model_path("smollm2")
        for name in ("float32", "bfloat16"):
            model = AutoModelForCausalLM.from_pretrained(
                os.path.dirname(path), gguf_file=os.path.basename(path), dtype=getattr(torch, name)
            ).eval()
            for batch in (1, 8):
                how = "one at a time" if batch == 1 else "batches of 8"
                label = f"transformers {name}, {how}"
                hf[label] = run_transformers(model, work, batch, label)["tok/s"]
            del model

    print("\nratios")
    if hf:
        best = max((v, k) for k, v in hf.items() if k.startswith("transformers"))
        same = max(v for k, v in hf.items() if k.startswith(f"transformers {dtype}"))
        print(f"  engine / best transformers:          {ours / best[0]:6.2f}x  (target >= 4x)")
        print(f"    (best: {best[1]})")
        print(f"  engine / transformers, same dtype:   {ours / same:6.2f}x")
        fp32_hf = max(v for k, v in hf.items() if k.startswith("transformers float32"))
        print(f"  engine fp32 / transformers fp32:     {hf['engine float32'] / fp32_hf:6.2f}x")
    print(f"  engine / compute floor:              {ours / floor:6.2f}   (target >= 0.70)")
    print(f"  engine / batched-decode floor:       {ours / floor_batched:6.2f}")
    print(
        f"  TTFT p50 prefix cache off / on:      {uncached['ttft_p50'] / cached['ttft_p50']:6.2f}x"
        "  (target >= 5x)"
    )
    print(f"  HTTP / in-process throughput:        {http / ours:6.2f}   (target >= 0.90)")


if __name__ == "__main__":
    main()
