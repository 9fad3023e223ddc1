"""What serving LoRA adapters costs the engine: output tokens per second of the same greedy
workload with no adapter, with every request on one adapter, and with the requests spread over
several adapters (each step then mixes them), one request at a time and many at once.

    .venv/bin/python bench/lora.py [--adapters 4] [--rank 16] [--targets all|qv] [--requests 16]

In process (LLMEngine stepped directly: no HTTP), the engine's defaults (bf16 on CPUs with bf16
dot products, the GGUF's weights as shipped). Adapters have random matrices on all seven
projections of every layer, or on q_proj and v_proj (PEFT's layout, written to a temporary
folder): the cost depends on their rank and targets, not their values. EOS is ignored so that
every mode makes the same number of tokens. The modes take turns, and each one's best round counts.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

from engine_vs_llamacpp import cpu_flags

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.engine.prompts import chat_prompts
from tests.lora_files import PROJECTIONS, lora_tensors, write_adapter


def run(engine: LLMEngine, prompts, adapters, at_once: int, max_tokens: int) -> float:
    """Output tokens per second of the prompts, at_once of them running together."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    pending = [
        GenerationRequest(f"r{i}", ids, params, adapter=adapters[i % len(adapters)])
        for i, ids in enumerate(prompts)
    ]
    produced, start = 0, time.perf_counter()
    while pending or engine.has_work():
        while pending and len(engine.scheduler.running) + engine.scheduler.num_waiting < at_once:
            engine.add_request(pending.pop(0))
        produced += sum(len(o.token_ids) for o in engine.step())
    return produced / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--targets", default="all", choices=["all", "qv"], help="every projection, or q and v"
    )
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="the best of this many runs a mode")
    args = parser.parse_args()
    print(f"CPU: {cpu_flags()}")
    engine = LLMEngine(EngineConfig(device="cpu", enable_prefix_caching=False))
    config = engine.model_config
    print(f"engine: {engine.runner.dtype}, quantization {engine.config.quantization}")
    targets = tuple(PROJECTIONS) if args.targets == "all" else ("q_proj", "v_proj")
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.adapters):
            tensors = lora_tensors(config, args.rank, targets, seed=i)
            path = write_adapter(Path(root) / f"a{i}", tensors, args.rank, 2 * args.rank, targets)
            engine.runner.adapters.add(f"a{i}", path)
    adapters = list(engine.runner.adapters.by_name.values())
    prompts = [engine.tokenizer.apply_chat_template(m) for m in chat_prompts()]
    prompts = (prompts * (1 + args.requests // len(prompts)))[: args.requests]
    modes = {"no adapter": [None], "one adapter": adapters[:1], "mixed adapters": adapters}
    run(engine, prompts[:2], [None], 2, 8)  # warm-up: kernels, allocator
    print(
        f"\n{args.requests} requests x {args.max_tokens} tokens, rank {args.rank}, {args.targets}"
    )
    print("| at once | mode | output tok/s | vs no adapter |\n|---|---|---|---|")
    for at_once in (1, args.requests):
        best = dict.fromkeys(modes, 0.0)
        for _ in range(args.rounds):  # the modes in turn, each round: drifts hit all alike
            for mode, spread in modes.items():
                rate = run(engine, prompts, spread, at_once, args.max_tokens)
                best[mode] = max(best[mode], rate)
        for mode, rate in best.items():
            print(f"| {at_once} | {mode} | {rate:.1f} | {rate / best['no adapter']:.2f}x |")


if __name__ == "__main__":
    main()
