"""Prompt lookup replayed offline on the copy-heavy workload's real outputs: how many tokens a step
the engine's proposer and draft-length policy would emit, in seconds and without the machine's
noise, so a proposer change can be judged before the engine runs it (bench/speculative.py).

The eight tasks of bench/speculative.py run once without speculation (greedy; the outputs are
kept under var/ and reused). Then each output is replayed step by step: the proposer sees the
prompt and the output so far, the draft's longest prefix equal to the real output is accepted, the
step emits it plus one token, and `Acceptance` and `draft_length` set the next draft's length as in
the scheduler (with the engine's CPU_ROW_COST unless --policy-row-cost says otherwise). A step
costs 1 + row_cost per draft row (the measured cost of a verify row), so the modelled speedup is
tokens over cost. Greedy output does not depend on the drafts, which is what
makes the replay exact (up to the near-ties that bf16 rows may break another way in the engine).
"Lookup bound": a proposer that always picks the longest correct continuation found anywhere in
the prompt and output (up to the draft limit), the most any prompt-lookup rule could accept.

    .venv/bin/python bench/speculative_replay.py [--speculative-tokens 8] [--max-tokens 256]
        [--row-cost 0.14] [--policy-row-cost 0.2] [--fresh]
"""

import argparse
import json
from pathlib import Path

from engine_vs_llamacpp import cpu_flags
from speculative import TASKS, run_one

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.sequence import GenerationRequest, SamplingParams
from tokenyard.engine.speculative import CPU_ROW_COST, Acceptance, NgramProposer, draft_length

CACHE = Path("var") / "bench" / "speculative-outputs.json"


def outputs(max_tokens: int, fresh: bool) -> list[dict[str, list[int]]]:
    """Each task's prompt and greedy output without speculation, generated once per length."""
    cached = json.loads(CACHE.read_text()) if CACHE.exists() and not fresh else {}
    if str(max_tokens) not in cached:
        engine = LLMEngine(EngineConfig(device="cpu", enable_prefix_caching=False))
        template = engine.tokenizer.apply_chat_template
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        runs = []
        for i, task in enumerate(TASKS):
            prompt = template([{"role": "user", "content": task}])
            tokens, _, _ = run_one(engine, GenerationRequest(f"replay-{i}", prompt, params))
            runs.append({"prompt": prompt, "output": tokens})
        cached[str(max_tokens)] = runs
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cached))
    return cached[str(max_tokens)]


def accepted(draft: list[int], truth: list[int]) -> int:
    n = 0
    while n < min(len(draft), len(truth)) and draft[n] == truth[n]:
        n += 1
    return n


def replay(
    prompt: list[int], output: list[int], most: int, row_cost: float, policy_cost: float
) -> tuple[int, float]:
    """Steps and their cost (in one-row steps) to emit the output after its first token, drafts
    as long as `draft_length` makes them for rows of `policy_cost`."""
    proposer, acceptance = NgramProposer(), Acceptance()
    done, steps, cost = 1, 0, 0.0  # the prefill emits the first token
    while done < len(output):
        room = min(most, len(output) - done - 1, draft_length(acceptance.rate, most, policy_cost))
        draft = proposer.propose(prompt + output[:done], room) if room > 0 else []
        kept = accepted(draft, output[done:])
        if draft:
            acceptance.record(len(draft), kept)
        acceptance.decay()
        steps, cost, done = steps + 1, cost + 1 + row_cost * len(draft), done + 1 + kept
    return steps, cost


def lookup_bound(prompt: list[int], output: list[int], most: int) -> int:
    """Steps if every draft were the longest correct continuation found earlier in the text."""
    done, steps = 1, 0
    while done < len(output):
        text, truth = prompt + output[:done], output[done : done + most]
        longest = 0
        while longest < len(truth) and _occurs(truth[: longest + 1], text):
            longest += 1
        steps, done = steps + 1, done + 1 + longest
    return steps


def _occurs(piece: list[int], text: list[int]) -> bool:
    n = len(piece)
    return any(text[i : i + n] == piece for i in range(len(text) - n + 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speculative-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--row-cost", type=float, default=0.14, help="a verify row's cost")
    parser.add_argument(
        "--policy-row-cost",
        type=float,
        default=CPU_ROW_COST,
        help="the row cost the draft-length policy assumes (default: the engine's)",
    )
    parser.add_argument("--fresh", action="store_true", help="generate the outputs again")
    args = parser.parse_args()
    runs = outputs(args.max_tokens, args.fresh)
    k, row_cost = args.speculative_tokens, args.row_cost
    policy = args.policy_row_cost
    print(f"CPU: {cpu_flags()} (the outputs' rounding)")
    print(f"k={k}, row cost {row_cost}, the policy's row cost {policy}")
    print("task output  tokens/step  modelled speedup  lookup bound (tokens/step)")
    totals = [0, 0, 0.0, 0]  # tokens after the first, steps, cost, bound's steps
    for i, run in enumerate(runs):
        prompt, output = run["prompt"], run["output"]
        steps, cost = replay(prompt, output, k, row_cost, policy)
        bound = lookup_bound(prompt, output, k)
        tokens = len(output) - 1
        for j, v in enumerate((tokens, steps, cost, bound)):
            totals[j] += v
        if steps:
            print(
                f"{i:4d} {len(output):6d} {tokens / steps:12.2f} {tokens / cost:16.2f}x "
                f"{tokens / bound:14.2f}"
            )
    tokens, steps, cost, bound = totals
    print(
        f"all: {tokens / steps:.2f} tokens a step, modelled decode speedup {tokens / cost:.2f}x, "
        f"lookup bound {tokens / bound:.2f} tokens a step"
    )


if __name__ == "__main__":
    main()
