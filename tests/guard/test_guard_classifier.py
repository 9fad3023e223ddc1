"""The shipped safety classifier: loads, separates harmful from benign on held-out rows, never
crashes on what a client may send, and stays fast on long prompts."""

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from tokenyard.guard.classifier import DEFAULT_ARTIFACT, SafetyClassifier
from tokenyard.guard.policy import DEFAULT
from tokenyard.guard.service import decide
from tokenyard.guard.taxonomy import HARMFUL, HEADS, JAILBREAK
from tokenyard.guard.training.dataset import load
from tokenyard.guard.training.train import UNSEEN_BENIGN, TrainConfig, split_of
from tokenyard.router.training.dataset import load_routerbench
from tokenyard.router.training.probes import load_probe


def test_heads_and_thresholds(classifier: SafetyClassifier) -> None:
    assert classifier.heads == HEADS
    for head, t in classifier.thresholds().items():
        assert 0.0 < t < 1.0, head
    assert classifier.metadata["version"] == classifier.version


def test_held_out_rows_separate(classifier: SafetyClassifier) -> None:
    """On the test split the report was written from: harmful prompts score above benign ones,
    jailbreaks above benign ones (the report's figures, recomputed from the shipped artifact)."""
    config = TrainConfig()
    rows = [r for r in load() if r.direction == "input" and split_of(r, config) == "test"]
    rng = random.Random(0)
    rows = rng.sample(rows, min(len(rows), 1500))
    scores = [classifier.scores(r.text) for r in rows]
    harm = np.array([s[HARMFUL] for s in scores])
    jail = np.array([s[JAILBREAK] for s in scores])
    is_harm = np.array([r.harmful for r in rows])
    is_jail = np.array([r.jailbreak for r in rows])
    benign = np.array([not r.labels for r in rows])
    m = is_harm | benign
    assert average_precision_score(is_harm[m], harm[m]) > 0.8
    m = is_jail | benign
    assert average_precision_score(is_jail[m], jail[m]) > 0.85


def test_ordinary_prompts_of_unseen_sets_are_allowed(classifier: SafetyClassifier) -> None:
    """Exam questions from sets no guard model trains on (the router's ARC-Challenge and
    Winogrande), under the platform's default policy: all benign, so every flag is a false
    positive. With binary lexical features (v1) 28% and 14% of them were flagged as jailbreaks:
    the many everyday words of a long request added up."""
    defaults = classifier.thresholds()
    rules = DEFAULT.rules("input")
    for domain in UNSEEN_BENIGN:
        prompts = [r.prompt for r in load_routerbench(domain)]
        flagged = [p for p in prompts if decide(rules, classifier.scores(p), defaults).categories]
        assert len(flagged) <= 0.02 * len(prompts), (domain, len(flagged))


def test_code_prompts_no_model_trained_on_are_mostly_not_read_as_jailbreaks(
    classifier: SafetyClassifier,
) -> None:
    """Benign code questions (CRUXEval, never trained on): v2, which had seen no benign code or
    role-play request, flagged 89.6% of them as jailbreaks; v3 learnt both from GPTeacher. A
    weakness still (about 30%), reported rather than hidden: the shipped report's figure,
    recomputed from the shipped artifact."""
    report = json.loads(
        DEFAULT_ARTIFACT.with_name(f"{DEFAULT_ARTIFACT.stem}-report.json").read_text()
    )
    reported = report["unseen_benign"]["crux"]
    prompts = [r.prompt for r in load_probe("crux")]
    assert reported["prompts"] == len(prompts)
    threshold = classifier.thresholds()[JAILBREAK]
    rate = np.mean([classifier.scores(p)[JAILBREAK] >= threshold for p in prompts])
    assert rate == pytest.approx(reported["jailbreak_flagged_rate"], abs=0.01)
    assert rate < 0.4


BAD_INPUTS = [
    "",
    " ",
    "\n\t\r",
    "\x00" * 1000,
    "a" * 2_000_000,  # one 2 MB "word"
    "word " * 200_000,  # a million characters of words
    bytes(random.Random(1).randrange(256) for _ in range(50_000)).decode("latin-1"),
    "\ud800\udfff lone surrogates \udc80",
    "这是一个完全无害的中文句子，讨论天气和食物。",
    "هذه جملة عربية عادية عن الطقس",
    "Привет, как дела? Это обычный текст.",
    "🙂🙃🔥💣🧨" * 500,
    "ｆｕｌｌ　ｗｉｄｔｈ　ｔｅｘｔ",
    "<script>alert(1)</script>" * 100,
    "%s%n%x" * 1000,
    "\u202e\u200b\u200d\ufeff" * 100,
]


@pytest.mark.parametrize("text", BAD_INPUTS, ids=range(len(BAD_INPUTS)))
def test_bad_input_never_crashes(classifier: SafetyClassifier, text: str) -> None:
    scores = classifier.scores(text)
    assert set(scores) == set(HEADS)
    assert all(0.0 <= v <= 1.0 and v == v for v in scores.values())


def test_not_a_string(classifier: SafetyClassifier) -> None:
    for value in (None, 42, b"\xff\xfe bytes", ["a", "list"], {"a": 1}):
        scores = classifier.scores(value)
        assert all(0.0 <= v <= 1.0 for v in scores.values())


def test_empty_text_is_not_flagged(classifier: SafetyClassifier) -> None:
    thresholds = classifier.thresholds()
    for text in ("", "   ", "\x00\x00"):
        scores = classifier.scores(text)
        assert not [h for h in HEADS if scores[h] >= thresholds[h]], text


def test_long_prompt_latency(classifier: SafetyClassifier) -> None:
    """A prompt of ~8k tokens costs a bounded read (its two edges): well under the 2 ms budget on
    an idle machine (bench/guard_latency.py measures the p99); generous here for a busy CI."""
    words = Path(__file__).read_text().split()
    prompt = " ".join(words[i % len(words)] for i in range(6000))  # ~8k tokens
    for _ in range(20):
        classifier.scores(prompt)
    times = []
    for _ in range(200):
        began = time.perf_counter()
        classifier.scores(prompt)
        times.append(time.perf_counter() - began)
    assert np.median(times) < 0.005
