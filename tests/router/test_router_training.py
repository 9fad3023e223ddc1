"""Training determinism, leakage-free splits, and the metrics on cases with known answers."""

import argparse
import pickle

import numpy as np
import pytest
from tokenizers import Tokenizer

from router.classifier import _Compiled
from router.cli import add_parser
from router.dataset import load_gsm8k, load_mmlu, normalise, random_split, subject_folds
from router.features import (
    EMBED_CHARS,
    WORD_PROBLEM_STAT_NAMES,
    StaticEmbedding,
    word_problem_stats,
)
from router.metrics import apgr, cpt, routing_curve
from router.train import Candidate, fit, score


@pytest.fixture(scope="module")
def mmlu() -> list:
    return load_mmlu()


def test_decontaminated_counts_match_routellm(mmlu: list) -> None:
    # RouteLLM: 14,042 MMLU rows and 1,319 GSM8K rows before dropping the contaminated ones
    assert len(mmlu) == 14_037
    assert len(load_gsm8k()) == 1_307


def test_training_is_deterministic_with_a_seed(mmlu: list) -> None:
    rng = np.random.default_rng(1)
    subset = [mmlu[i] for i in rng.choice(len(mmlu), 800, replace=False)]
    probe = [e.prompt for e in mmlu[:200]]
    candidate = Candidate(target="escalate", c=1.0)
    first = score(fit(candidate, subset, seed=3), probe)
    second = score(fit(candidate, subset, seed=3), probe)
    np.testing.assert_array_equal(first, second)


def test_parts_weighted_zero_are_neither_fitted_nor_scored(mmlu: list) -> None:
    rng = np.random.default_rng(2)
    subset = [mmlu[i] for i in rng.choice(len(mmlu), 800, replace=False)] + load_gsm8k()[:100]
    candidate = Candidate(w_dense=0.0, w_length=0.5, w_subject=0.0, w_boost=1.0, w_strong=-1.0)
    model = fit(candidate, subset, seed=0)
    assert model.embedding_ is None and model.subject_ is None
    assert model.boost_ is not None and model.strong_ is not None
    compiled = _Compiled.from_model(model)
    assert compiled.dense is None and compiled.subject is None and compiled.has_strong
    probe = [e.prompt for e in mmlu[:100]] + ["", "hi", "x " * 5000]
    fast = [compiled.logit(p) for p in probe]
    np.testing.assert_allclose(fast, model.decision_function(probe), rtol=0, atol=1e-9)
    # weighting a part that was not fitted would silently add 0: it is refused
    with pytest.raises(ValueError):
        model.set_params(w_subject=1.0).decision_function(probe)


def test_word_problem_part_is_fitted_on_its_domain_and_gated_by_it(mmlu: list) -> None:
    rng = np.random.default_rng(4)
    gsm8k = load_gsm8k()
    subset = [mmlu[i] for i in rng.choice(len(mmlu), 800, replace=False)] + gsm8k[:200]
    # the subject gain weighted 0: the subject model is fitted for the word part's gate alone
    candidate = Candidate(w_dense=0.0, w_length=0.5, w_subject=0.0, w_boost=1.0, w_word=0.5)
    model = fit(candidate, subset, seed=0)
    # the expert saw the 200 word problems only, and is centred on them
    assert model.word_scaler_.n_samples_seen_ == 200
    assert model.subject_.classes_[model.word_class_] == "gsm8k"
    domain = [e.prompt for e in gsm8k[:200]]
    x = model.word_scaler_.transform([word_problem_stats(p) for p in domain])
    assert model.word_.decision_function(x).mean() == pytest.approx(model.word_center_, abs=1e-9)
    # the gate: word problems get the expert's logit, MMLU prompts little of it
    word = model.parts([e.prompt for e in gsm8k[200:300]] + [e.prompt for e in mmlu[:100]])[:, 6]
    assert np.abs(word[:100]).mean() > 5 * np.abs(word[100:]).mean()
    # below the gate's floor the expert is not consulted: most MMLU prompts get exactly 0
    assert (word[100:] == 0).mean() > 0.5 and (word[:100] != 0).all()
    compiled = _Compiled.from_model(model)
    assert compiled.word is not None and compiled.subject is not None
    probe = [e.prompt for e in gsm8k[300:350]] + [e.prompt for e in mmlu[:50]] + ["", "x " * 5000]
    fast = [compiled.logit(p) for p in probe]
    np.testing.assert_allclose(fast, model.decision_function(probe), rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="word-problem domain"):
        fit(candidate, subset[:800], seed=0)


def test_word_problem_stats_count_what_they_name() -> None:
    prompt = (
        "Siobhan has 2 fewer jewels than Aaron. Aaron has 5 more jewels than half of Raymond's "
        "jewels. If Raymond has 40 jewels and 1,250.5 left, how many are there? " + "9" * 400
    )
    stats = dict(zip(WORD_PROBLEM_STAT_NAMES, word_problem_stats(prompt), strict=True))
    assert stats["numbers"] == 5 and stats["distinct_numbers"] == 5 and stats["decimals"] == 1
    assert stats["max_integer_digits"] == 400  # counted, never parsed: no overflow
    assert stats["fractions"] == 1 and stats["comparisons"] == 2 and stats["remainders"] == 1
    assert stats["conditions"] == 1 and stats["sentences"] == 3
    assert stats["capitalised_words"] == 5  # Aaron ×2, Raymond ×2, If; the opening word is not
    assert word_problem_stats("") == [0.0] * len(WORD_PROBLEM_STAT_NAMES)


def test_random_split_keeps_duplicates_together(mmlu: list) -> None:
    split = random_split(mmlu, seed=0, val_frac=0.15, test_frac=0.25)
    parts = [
        {normalise(mmlu[i].prompt) for i in idx} for idx in (split.train, split.val, split.test)
    ]
    assert not parts[0] & parts[2] and not parts[1] & parts[2] and not parts[0] & parts[1]
    assert len(split.train) + len(split.val) + len(split.test) == len(mmlu)
    again = random_split(mmlu, seed=0, val_frac=0.15, test_frac=0.25)
    np.testing.assert_array_equal(split.test, again.test)


def test_subject_folds_hold_out_whole_subjects(mmlu: list) -> None:
    folds = subject_folds(mmlu, n_folds=5, seed=0)
    subjects = [{mmlu[i].subject for i in fold} for fold in folds]
    for k, s in enumerate(subjects):
        for other in subjects[k + 1 :]:
            assert not s & other
        # every example of a held-out subject is in the fold
        assert sum(len(f) for f in folds) == len(mmlu)
        assert all(mmlu[i].subject in s for i in folds[k])


def test_metrics_on_known_routers() -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    weak = rng.random(n) < 0.6
    strong = weak | (rng.random(n) < 0.5)
    gain = strong & ~weak
    oracle = routing_curve(gain.astype(float) + 0.01 * rng.random(n), weak, strong)
    random = routing_curve(rng.random(n), weak, strong)
    assert oracle.strong_share[0] == 0.0 and oracle.strong_share[-1] == 1.0
    assert apgr(random) == pytest.approx(0.5, abs=0.02)
    assert cpt(random, 0.5) == pytest.approx(0.5, abs=0.03)
    assert apgr(oracle) > 0.8
    # the oracle recovers half the gap by sending half of the gain prompts up
    assert cpt(oracle, 0.5) == pytest.approx(gain.mean() / 2, abs=0.03)


def test_cli_registers_router_train() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["router", "train", "--seed", "7", "--bootstrap", "10"])
    assert args.seed == 7 and args.bootstrap == 10 and callable(args.run)


@pytest.fixture(scope="module")
def embedding() -> StaticEmbedding:
    return StaticEmbedding().fit([])


def test_token_pieces_match_the_tokenizer(embedding: StaticEmbedding, mmlu: list) -> None:
    # the piecewise (cached) tokenisation gives SmolLM2's own token ids on ordinary text
    tokenizer = Tokenizer.from_str(embedding.pieces_.tokenizer_json)
    prompts = [e.prompt[:EMBED_CHARS] for e in mmlu[::50]] + [e.prompt for e in load_gsm8k()[:50]]
    same = [
        embedding.pieces_.ids(p) == tokenizer.encode(p, add_special_tokens=False).ids
        for p in prompts
    ]
    assert np.mean(same) >= 0.95


def test_token_pieces_pickle_round_trip(embedding: StaticEmbedding) -> None:
    again = pickle.loads(pickle.dumps(embedding.pieces_))
    text = "Which of the following is NOT a prime number? A. 2\nB. 9"
    assert again.ids(text) == embedding.pieces_.ids(text) != []


def test_folded_embedding_equals_projection(embedding: StaticEmbedding, mmlu: list) -> None:
    texts = [e.prompt for e in mmlu[:100]] + ["", "hi"]
    weights = np.random.default_rng(0).normal(size=embedding.table_.shape[1])
    folded = embedding.fold(weights).transform(texts)[:, 0]
    np.testing.assert_allclose(folded, embedding.transform(texts) @ weights, rtol=0, atol=1e-9)
