"""Speculative decoding (n-gram prompt lookup) on a copy-heavy workload, one request at a time.

Eight requests whose answers copy from their prompts: summarise, extract from and rewrite a
~500-token report, and edit a ~400-token piece of code (rename, type hints, a docstring, a fix).
Greedy, EOS respected, prefix caching off (a prompt cached by the previous run would be prefilled
in a shorter chunk, whose rounding can break a near-tie the other way). The outputs are
token-identical with and without speculation (tests/engine/test_speculative.py): a draft's rows
round as a lone decode does, as decode rows (fp32) or through the bf16 prefill kernel's exact
mode, which shares the decode kernel's arithmetic; the table gives how many leading tokens agree.

One engine with speculation on; the baseline is the same engine with each request opting out
(`speculative=False`), run alternately request by request so that load on a shared machine falls
on both alike. Output tok/s is completion tokens over the request's time from arrival to its last
token; decode tok/s leaves the prefill out. "ceiling" is the speedup speculation would give if
verifying a draft cost nothing: the speculating run's tokens over its steps (each step emits one
token plus the draft tokens it accepted). It bounds what faster verification can reach; only
outputs that copy more (or a better proposer) raise it. The last line also gives that ceiling for
output tok/s, prefill included: the speculating run's prefill time, plus its steps at the
non-speculating run's time per step (speculation does not shorten a prefill, so at short outputs
this bounds the whole-request speedup well below the decode ceiling).

With `--prediction`, the same comparison for OpenAI's Predicted Outputs: the engine does not
speculate by itself (`speculative_tokens=0`), and "on" requests send the text their task works on
(the report, the code) as their `prediction`, which the engine drafts from (up to
`--prediction-tokens` a step); "off" requests send none.

    .venv/bin/python bench/speculative.py [--speculative-tokens 4] [--rounds 2] [--dtype auto]
        [--quantization auto] [--max-tokens 256] [--row-cost 0.2]
        [--prediction [--prediction-tokens 8]]
"""

import argparse
import statistics
import time

from tokenyard.engine.config import EngineConfig
from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.sequence import GenerationRequest, SamplingParams

REPORT = """\
Harbour Logistics quarterly report, third quarter.

Volumes. The Rotterdam terminal handled 412,000 containers in the quarter, up 6 percent on the \
same quarter last year, while the Antwerp terminal handled 198,000, down 3 percent. Average dwell \
time at Rotterdam fell from 4.1 days to 3.6 days after the new gate system went live in July. \
Rail departures rose to 41 a week, and the share of containers leaving by rail reached 38 percent.

Finances. Revenue was 128.4 million euros, against 119.7 million a year earlier. Operating costs \
rose to 97.2 million, mostly because energy prices at the Antwerp cold store doubled in August. \
The operating margin was 24.3 percent. Capital spending of 18.9 million went mainly to two new \
ship-to-shore cranes, which are due to enter service in February.

People. Headcount at the end of the quarter was 1,214, including 86 new crane operators and \
technicians. Lost-time injuries fell from 7 to 3. The training centre in Vlissingen ran 64 \
courses, and 412 employees completed the new safety programme.

Outlook. The board expects volumes in the fourth quarter to stay close to this quarter's, with \
Antwerp recovering slowly once the dredging of the access channel ends in November. It approved \
a budget of 42 million euros for an automated stacking yard at Rotterdam, to be built in three \
phases from next spring, and asked management to report on the energy contract in Antwerp before \
the end of the year.
"""

CODE = """\
def merge_ranges(ranges):
    result = []
    for start, end in sorted(ranges):
        if result and start <= result[-1][1]:
            result[-1] = (result[-1][0], max(result[-1][1], end))
        else:
            result.append((start, end))
    return result


def total_length(ranges):
    total = 0
    for start, end in merge_ranges(ranges):
        total += end - start
    return total


def find_gaps(ranges, lower, upper):
    gaps = []
    cursor = lower
    for start, end in merge_ranges(ranges):
        if start > cursor:
            gaps.append((cursor, min(start, upper)))
        cursor = max(cursor, end)
        if cursor >= upper:
            break
    if cursor < upper:
        gaps.append((cursor, upper))
    return gaps


def covers(ranges, point):
    for start, end in merge_ranges(ranges):
        if start <= point < end:
            return True
    return False
"""

TASKS = [
    f"Summarise this report in five sentences, keeping every number it gives:\n\n{REPORT}",
    f"From this report, list every sentence that contains a number, word for word:\n\n{REPORT}",
    f"Rewrite this report as bullet points, one per sentence, keeping the wording:\n\n{REPORT}",
    f"Copy the 'Finances' and 'Outlook' paragraphs of this report exactly:\n\n{REPORT}",
    f"Rename the function merge_ranges to coalesce everywhere in this code and return the whole "
    f"code:\n\n{CODE}",
    f"Add Python type hints to every function in this code and return the whole code:\n\n{CODE}",
    f"Add a one-line docstring to every function in this code and return the whole code:\n\n{CODE}",
    f"The function covers should also accept the end point. Fix it and return the whole code:"
    f"\n\n{CODE}",
]
SOURCES = [REPORT] * 4 + [CODE] * 4  # the text each task works on: its prediction


def run_one(engine: LLMEngine, request: GenerationRequest) -> tuple[list[int], float, float]:
    """Tokens, seconds from arrival to the last token, and to the first."""
    engine.add_request(request)
    tokens: list[int] = []
    first = 0.0
    while engine.has_work():
        for out in engine.step():
            if not tokens:
                first = time.perf_counter() - request.arrival
            tokens += out.token_ids
    return tokens, time.perf_counter() - request.arrival, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speculative-tokens", type=int, default=4)
    parser.add_argument(
        "--row-cost", type=float, default=None, help="a draft row's cost (default: the engine's)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each request per mode")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prediction", action="store_true", help="compare Predicted Outputs")
    parser.add_argument("--prediction-tokens", type=int, default=8)
    args = parser.parse_args()
    if args.prediction:
        args.speculative_tokens = 0  # drafts come from the predictions alone

    engine = LLMEngine(
        EngineConfig(
            device="cpu",
            dtype=args.dtype,
            quantization=args.quantization,
            speculative_tokens=args.speculative_tokens,
            speculative_row_cost=args.row_cost,
            prediction_tokens=args.prediction_tokens,
            enable_prefix_caching=False,
        )
    )
    runner = engine.runner
    print(
        f"engine: {runner.dtype}, weights {args.quantization}, "
        f"{type(runner.attention).__name__}, k={args.speculative_tokens}"
        + (f", predicted outputs (k={args.prediction_tokens})" if args.prediction else "")
    )
    template = engine.tokenizer.apply_chat_template
    prompts = [template([{"role": "user", "content": task}]) for task in TASKS]
    encode = engine.tokenizer.hf.encode
    predictions = [encode(text, add_special_tokens=False) for text in SOURCES]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    run_one(engine, GenerationRequest("warm-up", prompts[0], SamplingParams(max_tokens=8)))

    totals = {False: [0, 0.0, 0.0], True: [0, 0.0, 0.0]}  # tokens, e2e seconds, decode seconds
    proposed = engine.metrics.spec_proposed._value.get()
    accepted = engine.metrics.spec_accepted._value.get()
    print("task prompt output off/on  agree off tok/s  on tok/s speedup ceiling")
    for i, ids in enumerate(prompts):
        rates, outputs = {}, {}
        emitted = taken = 0.0  # the speculating runs' tokens, and the draft tokens they accepted
        for r in range(args.rounds):
            for speculative in (False, True):
                request = GenerationRequest(f"t{i}-{r}-{speculative}", ids, params)
                if args.prediction:
                    request.prediction = predictions[i] if speculative else []
                else:
                    request.speculative = speculative
                before = engine.metrics.spec_accepted._value.get()
                tokens, e2e, first = run_one(engine, request)
                if speculative:
                    emitted += len(tokens)
                    taken += engine.metrics.spec_accepted._value.get() - before
                outputs.setdefault(speculative, tokens)
                total = totals[speculative]
                total[0] += len(tokens)
                total[1] += e2e
                total[2] += e2e - first
                rates.setdefault(speculative, []).append(len(tokens) / e2e)
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        same = next(
            (j for j, (a, b) in enumerate(zip(*outputs.values(), strict=False)) if a != b),
            min(map(len, outputs.values())),
        )
        print(
            f"{i:>4} {len(ids):>6} {len(outputs[False]):>4}/{len(outputs[True]):<4} {same:>6} "
            f"{off:>9.1f} {on:>9.1f} {on / off:>6.2f}x {emitted / (emitted - taken):>6.2f}x"
        )
    proposed = engine.metrics.spec_proposed._value.get() - proposed
    accepted = engine.metrics.spec_accepted._value.get() - accepted
    (n_off, e2e_off, dec_off), (n_on, e2e_on, dec_on) = totals[False], totals[True]
    out_off, out_on, steps = n_off / e2e_off, n_on / e2e_on, n_on - accepted
    # output tok/s verifying for free: each request's first token comes from its prefill
    requests = len(prompts) * args.rounds
    step_off = dec_off / (n_off - requests)
    free = n_on / (e2e_on - dec_on + (steps - requests) * step_off)
    print(
        f"all: output tok/s off {out_off:.1f}, on {out_on:.1f} ({out_on / out_off:.2f}x); decode "
        f"tok/s off {n_off / dec_off:.1f}, on {n_on / dec_on:.1f} "
        f"({n_on / dec_on / (n_off / dec_off):.2f}x); drafts accepted "
        f"{accepted:.0f}/{proposed:.0f} ({accepted / max(proposed, 1):.0%}); ceiling with free "
        f"verification: decode {n_on / steps:.2f}x, output {free / out_off:.2f}x"
    )


if __name__ == "__main__":
    main()
