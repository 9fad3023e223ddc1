"""Forward-pass time of a step of one sequence's few new tokens over a cached context: a
speculating sequence's verify step (1 + its draft), or a short follow-up turn after a cached
conversation. Printed against the one-token (decode) step over the same context.

    .venv/bin/python bench/chunk_steps.py [--contexts 450 900 2000 4000] [--rows 1 3 5 9 16]

The model's real weights (the engine's defaults: bf16 on CPUs with bf16 dot products, GGUF
weights as shipped), random token ids; best of 3 runs of 20 steps each, LM head included.
"""

import argparse
import time

import torch
from engine_vs_llamacpp import cpu_flags

from tokenyard.engine.attention import SeqSlice
from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine


def best_step_ms(engine: LLMEngine, ids, positions, meta, steps: int) -> float:
    """The best of 3 runs of `steps` steps (forward pass and LM head) of the same inputs, in ms."""
    runner, best = engine.runner, float("inf")
    with torch.inference_mode():
        for _ in range(3):
            runner.forward(ids, positions, meta)
            start = time.perf_counter()
            for _ in range(steps):
                runner.model.logits(runner.forward(ids, positions, meta))
            best = min(best, (time.perf_counter() - start) / steps * 1e3)
    return best


def step_ms(engine: LLMEngine, context: int, rows: int, steps: int = 20) -> float:
    runner = engine.runner
    table = list(range(1, 1 + -(-context // runner.block_size)))
    ids = torch.randint(0, engine.model_config.vocab_size, (rows,))
    positions = torch.arange(context - rows, context)
    # a one-token step is a decode; more tokens are a chunk after its cached context
    slices = [SeqSlice(table, context - rows, rows)]
    meta = runner.attention.build_metadata(slices, 1 if rows == 1 else 0)
    return best_step_ms(engine, ids, positions, meta, steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", type=int, nargs="+", default=[450, 900, 2000, 4000])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 3, 5, 9, 16])
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks = -(-max(args.contexts) // 16) + 8
    engine = LLMEngine(EngineConfig(num_blocks=blocks))
    print(f"CPU: {cpu_flags()}")
    print(f"engine: {engine.runner.dtype}, {type(engine.runner.attention).__name__}")
    print("context rows     ms  x one-token step")
    for context in args.contexts:
        one = step_ms(engine, context, 1)
        for rows in args.rows:
            ms = one if rows == 1 else step_ms(engine, context, rows)
            print(f"{context:7d} {rows:4d} {ms:6.2f}  {ms / one:.2f}x")


if __name__ == "__main__":
    main()
