"""What reading a prompt once for a request's n choices saves: requests of n sampled choices over
a long prompt, one at a time, with the choices held until the first has read the prompt (the
engine's policy) and with all n reading it side by side (the policy before; the bench patches
the scheduler back to it). Time per request and to its first token, and the prompt tokens the
forward passes computed.

    .venv/bin/python bench/parallel_sampling.py [--n 4] [--prompt-tokens 1000] [--requests 4]

In process (LLMEngine stepped directly), the engine's defaults (bf16 on CPUs with bf16 dot
products, the GGUF's weights as shipped, prefix caching on). Each request's prompt is new to the
cache. The modes take turns; each one's best round counts.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from engine_vs_llamacpp import cpu_flags

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.scheduler import Scheduler
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.engine.prompts import FILLER

SHARED = Scheduler.add_choices


def side_by_side(self: Scheduler, seqs) -> None:
    for seq in seqs:
        self.add(seq)


def run(engine: LLMEngine, prompts: list[list[int]], n: int, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1, ignore_eos=True)
    e2e, ttft, computed = [], [], 0
    for i, ids in enumerate(prompts):
        start, first = time.perf_counter(), None
        engine.add_request(GenerationRequest(f"p{i}-{time.time_ns()}", ids, params, n=n))
        while engine.has_work():
            outs = engine.step()
            if first is None and any(o.token_ids for o in outs):
                first = time.perf_counter() - start
            for out in outs:
                if out.stats:
                    computed += out.stats.prompt_tokens - out.stats.cached_tokens
        e2e.append(time.perf_counter() - start)
        ttft.append(first)
    return {"e2e": statistics.median(e2e), "ttft": statistics.median(ttft), "read": computed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"CPU: {cpu_flags()}")
    engine = LLMEngine(EngineConfig(device="cpu"))
    print(f"engine: {engine.runner.dtype}, quantization {engine.config.quantization}")
    text = engine.tokenizer.encode(FILLER * 40)
    best: dict[str, dict] = {}
    for r in range(args.rounds):
        for mode, policy in (("held (now)", SHARED), ("side by side (before)", side_by_side)):
            Scheduler.add_choices = policy
            # each request's prompt new to the cache: a number of its own first
            prompts = [
                engine.tokenizer.encode(f"Document {r}-{mode}-{i}:\n") + text[: args.prompt_tokens]
                for i in range(args.requests)
            ]
            got = run(engine, prompts, args.n, args.max_tokens)
            if mode not in best or got["e2e"] < best[mode]["e2e"]:
                best[mode] = got
    Scheduler.add_choices = SHARED
    print(f"n={args.n}, prompts of ~{args.prompt_tokens} tokens, {args.max_tokens} tokens a choice")
    print(f"{'mode':<24}{'e2e s':>8}{'ttft s':>8}{'prompt tokens read':>20}")
    for mode, got in best.items():
        print(f"{mode:<24}{got['e2e']:>8.2f}{got['ttft']:>8.2f}{got['read']:>20}")
    now, before = best["held (now)"], best["side by side (before)"]
    print(
        f"ratio (now / before): e2e {now['e2e'] / before['e2e']:.2f}x, "
        f"ttft {now['ttft'] / before['ttft']:.2f}x"
    )


if __name__ == "__main__":
    main()
