"""Scoring texts (OpenAI's echo with logprobs, max_tokens 0: each token's logprob given the ones
before, what evaluation harnesses and perplexity filters ask for): the engine against transformers
on the same GGUF, in one run.

    .venv/bin/python bench/prompt_scoring.py [--docs 16] [--rounds 3]

The text is tests/engine/data/alice_ch4.txt (public domain), cut into --docs documents of equal
token count. The engine (in process, its defaults: bf16 on CPUs with bf16 dot products, the
GGUF's weights as shipped) scores them one request at a time and all at once; transformers
(its own GGUF loading, dequantized) runs one forward pass per document, fp32 and bf16. Tokens
scored per second, best of --rounds, and each one's perplexity over all documents.
"""

import argparse
import math
import os
import time
from pathlib import Path

import torch
from engine_vs_llamacpp import cpu_flags

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.loader import resolve_model_path
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

TEXT = Path(__file__).resolve().parents[1] / "tests" / "engine" / "data" / "alice_ch4.txt"


def engine_scores(engine: LLMEngine, docs: list[list[int]], at_once: bool) -> list[float]:
    params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    scores: list[float] = []
    batches = [docs] if at_once else [[d] for d in docs]
    for batch in batches:
        for i, ids in enumerate(batch):
            engine.add_request(GenerationRequest(f"d{i}-{time.time_ns()}", ids, params))
        while engine.has_work():
            for out in engine.step():
                scores += [s.logprob for s in out.prompt_logprobs or []]
    return scores


def reference_scores(model, docs: list[list[int]]) -> list[float]:
    scores: list[float] = []
    with torch.inference_mode():
        for ids in docs:
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
            chosen = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])
            scores += chosen[:, 0].tolist()
    return scores


def best_rate(run, tokens: int, rounds: int) -> tuple[float, list[float]]:
    best, scores = math.inf, []
    for _ in range(rounds):
        start = time.perf_counter()
        scores = run()
        best = min(best, time.perf_counter() - start)
    return tokens / best, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU: {cpu_flags()}")
    torch.set_num_threads(os.cpu_count() or 1)
    engine = LLMEngine(EngineConfig(device="cpu", enable_prefix_caching=False))
    ids = engine.tokenizer.encode(TEXT.read_text())
    size = len(ids) // args.docs
    docs = [ids[i * size : (i + 1) * size] for i in range(args.docs)]
    scored = sum(len(d) - 1 for d in docs)
    print(f"{args.docs} documents of {size} tokens, {scored} tokens scored")
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("smollm2")
    rows = []
    for label, at_once in (("engine, one at a time", False), ("engine, all at once", True)):
        rate, scores = best_rate(
            lambda a=at_once: engine_scores(engine, docs, a), scored, args.rounds
        )
        rows.append((f"{label} ({engine.runner.dtype}, as shipped)", rate, scores))
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype
        ).eval()
        rate, scores = best_rate(lambda m=model: reference_scores(m, docs), scored, args.rounds)
        rows.append((f"transformers, one at a time ({dtype})", rate, scores))
    print(f"{'':<58}{'tokens/s':>10}{'perplexity':>12}")
    for label, rate, scores in rows:
        ppl = math.exp(-sum(scores) / len(scores))
        print(f"{label:<58}{rate:>10.0f}{ppl:>12.3f}")
    best_reference = max(rate for label, rate, _ in rows if label.startswith("transformers"))
    for label, rate, _ in rows[:2]:
        print(f"{label}: {rate / best_reference:.2f}x transformers' best")


if __name__ == "__main__":
    main()
