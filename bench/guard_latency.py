"""Safety classifier latency: one prompt's scores (every head) by prompt length, one scan for
personal data (every kind, a team's terms), and one output window's check, p50 / p99 / max over
many calls, in one thread, as the gateway runs it.

Prompts are real benign and jailbreak texts from guard/data stretched to the target length (in
MiniLM WordPiece tokens), so the word cache sees realistic vocabulary; each timing is one call on a
prompt not seen before in that size class (the tokenizer's word cache stays warm, as in a long-
running gateway).

    .venv/bin/python bench/guard_latency.py [--calls 2000]
"""

import argparse
import random
import statistics
import time
from collections.abc import Callable

from tokenyard.guard import pii
from tokenyard.guard.classifier import SafetyClassifier
from tokenyard.guard.training.dataset import load
from tokenyard.router.embedding import WordPieces, tokenizer_json

SIZES = (16, 128, 1024, 4096, 8192)


def stretch(texts: list[str], tokens: int, pieces: WordPieces, rng: random.Random) -> str:
    out: list[str] = []
    count = 0
    while count < tokens:
        t = rng.choice(texts)
        out.append(t)
        count += len(pieces.ids(t[:2000]))
    text = " ".join(out)
    # trim to about the target: characters per token of this text
    ratio = len(text) / max(count, 1)
    return text[: int(tokens * ratio)]


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def timed(work: Callable[[str], object], prompts: list[str], calls: int) -> list[float]:
    """Seconds of each call, the prompts taken in turn."""
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        work(prompts[i % len(prompts)])
        times.append(time.perf_counter() - t0)
    return times


def row(size: int, prompts: list[str], times: list[float]) -> None:
    chars = int(statistics.mean(len(p) for p in prompts))
    print(
        f"| {size} | {chars} | {pct(times, 50) * 1e6:.0f} | {pct(times, 99) * 1e6:.0f} | "
        f"{max(times) * 1e6:.0f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per size")
    args = parser.parse_args()
    rng = random.Random(0)
    began = time.perf_counter()
    clf = SafetyClassifier.load()
    print(f"# loaded in {time.perf_counter() - began:.2f} s", flush=True)
    pieces = WordPieces(tokenizer_json())
    texts = [r.text for r in load() if r.direction == "input"]
    print("| prompt tokens | chars | p50 µs | p99 µs | max µs |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        prompts = [stretch(texts, size, pieces, rng) for _ in range(50)]
        for p in prompts:  # warm: the word cache, as a running gateway has it
            clf.scores(p)
        row(size, prompts, timed(clf.scores, prompts, args.calls))
    # personal data (guard/pii.py, opt-in per team): every kind looked for, on the same kind of
    # text with a contact line (an email, a phone number, a card) added every ~2,000 characters
    contact = " Reach jo.doe@example.org or (415) 555-2671; card 4111 1111 1111 1111. "
    every = frozenset(pii.KINDS)
    terms = ("Project Falcon", "ACME")
    print("\n| personal data, prompt tokens | chars | p50 µs | p99 µs | max µs |")
    print("|---|---|---|---|---|")

    def scan(text: str) -> object:
        return pii.find(text, every, "US", terms)

    for size in SIZES:
        prompts = []
        for _ in range(20):
            text = stretch(texts, size, pieces, rng)
            cut = range(0, len(text), 2000)
            prompts.append(contact.join(text[i : i + 2000] for i in cut))
        row(size, prompts, timed(scan, prompts, max(args.calls // 10, 50)))
    # the output check: one 1,000-character window (TOKENYARD_GUARD_WINDOW_CHARS)
    windows = [stretch(texts, 300, pieces, rng)[:1000] for _ in range(50)]
    times = []
    for i in range(args.calls):
        t0 = time.perf_counter()
        clf.scores(windows[i % len(windows)])
        times.append(time.perf_counter() - t0)
    print(
        f"\noutput window (1,000 chars): p50 {pct(times, 50) * 1e6:.0f} µs, "
        f"p99 {pct(times, 99) * 1e6:.0f} µs"
    )


if __name__ == "__main__":
    main()
