"""The int8 KV pool against one in the model's dtype: tokens the same memory holds, and the time of
a decode step of B sequences over C cached tokens each (forward pass and LM head), both pools in
one process, measured alternately.

    .venv/bin/python bench/kv_cache_int8.py [--batches 1 16 64] [--contexts 500 2000 4000]

The engine's defaults otherwise (bf16 on CPUs with bf16 dot products, GGUF weights as shipped);
random token ids and random pool contents (the timing does not depend on them); best of 3 runs of
10 steps each.
"""

import argparse

import torch
from chunk_steps import best_step_ms
from engine_vs_llamacpp import cpu_flags

from tokenyard.engine.attention import SeqSlice
from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.kv_cache import blocks_for_budget


def step_ms(engine: LLMEngine, batch: int, context: int, steps: int = 10) -> float:
    runner = engine.runner
    width = -(-context // runner.block_size)
    slices = [
        SeqSlice(list(range(b * width, (b + 1) * width)), context - 1, 1) for b in range(batch)
    ]
    meta = runner.attention.build_metadata(slices, batch)
    ids = torch.randint(0, engine.model_config.vocab_size, (batch,))
    positions = torch.full((batch,), context - 1)
    return best_step_ms(engine, ids, positions, meta, steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[500, 2000, 4000])
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=64 * 2000, help="the pools' size")
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = -(-args.max_tokens // 16) + 8
    engines = {
        kv: LLMEngine(EngineConfig(num_blocks=blocks, kv_cache_dtype=kv)) for kv in ("auto", "int8")
    }
    runner = engines["auto"].runner
    print(f"CPU: {cpu_flags()}")
    print(f"engine: {runner.dtype}, {type(runner.attention).__name__}")
    config, size = runner.model_config, runner.block_size
    capacity = {
        kv: blocks_for_budget(config, size, runner.dtype, args.kv_cache_gib, kv == "int8") * size
        for kv in ("auto", "int8")
    }
    print(
        f"tokens in {args.kv_cache_gib} GiB: {capacity['auto']} ({runner.dtype}), "
        f"{capacity['int8']} (int8): {capacity['int8'] / capacity['auto']:.2f}x"
    )
    print("batch context  pool ms/step    int8 ms/step  int8 / pool")
    for batch in args.batches:
        for context in args.contexts:
            if batch * context > args.max_tokens:
                continue
            # alternately, twice each: the VM's noise falls on both
            times = {kv: [] for kv in engines}
            for _ in range(2):
                for kv, engine in engines.items():
                    times[kv].append(step_ms(engine, batch, context))
            plain, int8 = min(times["auto"]), min(times["int8"])
            print(f"{batch:5d} {context:7d} {plain:13.2f} {int8:15.2f} {int8 / plain:11.2f}x")


if __name__ == "__main__":
    main()
