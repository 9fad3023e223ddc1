"""Data loading, leakage-free splits, the fit's within-domain learning, feature storage, the cost
policy, and the metrics on cases with known answers."""

import argparse
import itertools

import numpy as np
import pytest

from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.router.cli import add_parser
from tokenyard.router.embedding import WordPieces, edges, tokenizer_json
from tokenyard.router.features import decode_features, encode_features, ratings
from tokenyard.router.quality import QualityCurve
from tokenyard.router.samples import Samples
from tokenyard.router.training.costs import cost_quality, fit_curves, own_curves
from tokenyard.router.training.dataset import (
    ROUTERBENCH_STRONG,
    ROUTERBENCH_WEAK,
    Routed,
    last_question,
    load_domains,
    load_gsm8k,
    load_mmlu,
    normalise,
    random_split,
)
from tokenyard.router.training.evaluation import apgr, cpt, routing_curve
from tokenyard.router.training.train import (
    Recipe,
    TrainConfig,
    choose,
    embed_raw,
    evaluate,
    evaluate_mixed,
    fit,
    labels,
    mixed_sample,
    samples,
    selection_row,
)


@pytest.fixture(scope="module")
def domains() -> dict:
    return load_domains()


@pytest.fixture(scope="module")
def pieces() -> WordPieces:
    return WordPieces(tokenizer_json())


def test_every_domain_loads_with_the_same_model_pair(domains: dict) -> None:
    # RouteLLM: 14,042 MMLU rows and 1,319 GSM8K rows before dropping the contaminated ones;
    # RouterBench: 1,484 ARC rows of which 28 lack a score, 1,267 Winogrande rows
    assert {k: len(v) for k, v in domains.items()} == {
        "mmlu": 14_037,
        "gsm8k": 1_307,
        "mt_bench": 72,
        "arc_challenge": 1_456,
        "winogrande": 1_267,
    }
    arc = domains["arc_challenge"][0]
    assert arc.correct is not None
    assert arc.weak == arc.correct[ROUTERBENCH_WEAK]
    assert arc.strong == arc.correct[ROUTERBENCH_STRONG]
    # the few-shot examples are cut: one question, its options, the instruction
    assert arc.prompt.count("Answer:") == 1 and not arc.prompt.startswith("\n")
    assert all(0.0 <= r.weak <= 1.0 and 0.0 <= r.strong <= 1.0 for d in domains.values() for r in d)


def test_last_question_drops_the_shots() -> None:
    prompt = "Q1?\nA) x\nAnswer:\nA\n\nQ2?\nA) y\nAnswer:"
    assert last_question(prompt) == "Q2?\nA) y\nAnswer:"
    assert last_question("no shots") == "no shots"


def test_labels_on_graded_and_binary_quality() -> None:
    s = Samples(
        raw=np.zeros((4, 2)),
        log_chars=np.zeros(4),
        weak=np.array([0.0, 1.0, 0.75, 0.9]),
        strong=np.array([1.0, 1.0, 0.78, 0.96]),
        domain=np.array(["a"] * 4),
    )
    np.testing.assert_array_equal(labels(s, "escalate"), [True, False, False, True])
    np.testing.assert_array_equal(labels(s, "weak_fails"), [True, False, True, False])
    with pytest.raises(ValueError):
        labels(s, "nope")


def test_word_pieces_match_the_tokenizer(pieces: WordPieces, domains: dict) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(pieces.tokenizer_json)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    prompts = [r.prompt for d in domains.values() for r in d[::300]]
    same = [
        pieces.ids(p) == tokenizer.encode(edges(p), add_special_tokens=False).ids for p in prompts
    ]
    assert np.mean(same) >= 0.95


def test_fit_learns_within_domains_not_which_domain_is_hardest(pieces: WordPieces) -> None:
    """Two domains: one all hard, one all easy, differing only in topic; within each, prompts with
    a marker word are the hard ones. The fit ranks by the marker, not by the topic."""
    rng = np.random.default_rng(0)
    weak, domain, prompts = [], [], []
    table = rng.normal(size=(pieces_vocab(pieces), 384)).astype(np.float32)
    for d, base_fail in (("chem", 0.9), ("poetry", 0.1)):
        for i in range(300):
            hard = rng.random() < 0.5
            fails = rng.random() < (base_fail + (0.09 if hard else -0.09))
            words = ["molecule acid" if d == "chem" else "sonnet rhyme", f"item {i}"]
            prompts.append(" ".join(words + (["tricky"] if hard else ["plain"])))
            weak.append(0.0 if fails else 1.0)
            domain.append(d)
    from tokenyard.router.training.dataset import Routed

    rows = [Routed(p, d, d, w, 1.0) for p, d, w in zip(prompts, domain, weak, strict=True)]
    s = samples(rows, embed_raw(rows, table, pieces))
    config = TrainConfig(centroids=4)
    scorer = fit(Recipe(target="weak_fails", c=1.0, dims=8, w_length=0.0), s, table, pieces, config)
    tricky = scorer.route_score("sonnet rhyme item 1 tricky")
    plain = scorer.route_score("sonnet rhyme item 1 plain")
    chem_plain = scorer.route_score("molecule acid item 1 plain")
    assert tricky.score > plain.score
    # the topic's base rate is not what it learnt: a plain chemistry prompt is not the hardest
    assert chem_plain.score < tricky.score


def pieces_vocab(pieces: WordPieces) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(pieces.tokenizer_json).get_vocab_size()


def test_the_mixed_set_draws_each_graded_domain_alike(domains: dict) -> None:
    sample = mixed_sample(domains, seed=0)
    assert set(sample) == {"mmlu", "gsm8k", "arc_challenge", "winogrande"}  # not MT-Bench's scale
    smallest = min(len(domains[d]) for d in sample)
    for d, idx in sample.items():
        assert len(np.unique(idx)) == smallest and idx.min() >= 0 and idx.max() < len(domains[d])
    again = mixed_sample(domains, seed=0)
    assert all(np.array_equal(sample[d], again[d]) for d in sample)
    assert not all(np.array_equal(sample[d], mixed_sample(domains, 1)[d]) for d in sample)


def test_the_mixed_set_ranks_across_domains(domains: dict) -> None:
    """Scores that know only which domain a prompt is from (its weak model's failure rate there)
    rank nothing within a domain, but route the mixed set better than chance: across domains is
    part of what the mixed evaluation scores. Knowing each prompt's outcome routes it nearly
    perfectly; the reverse, worse than chance."""
    config = TrainConfig(bootstrap_resamples=50)
    weak = {d: np.array([r.weak for r in rows]) for d, rows in domains.items()}
    rate = {d: np.full(len(w), 1 - w.mean()) for d, w in weak.items()}
    by_domain = evaluate_mixed(rate, domains, config)["routers"]["classifier"]["apgr"]["value"]
    oracle = evaluate_mixed({d: 1 - w for d, w in weak.items()}, domains, config)
    reverse = evaluate_mixed(weak, domains, config)["routers"]["classifier"]["apgr"]["value"]
    assert oracle["n"] == 4 * min(len(domains[d]) for d in oracle["domains"])
    assert oracle["routers"]["classifier"]["apgr"]["value"] > 0.9
    assert oracle["minus_length"]["classifier"]["apgr"]["low"] > 0
    assert 0.55 < by_domain < 0.9 and reverse < 0.45


def test_route_features_round_trip() -> None:
    v = np.array([0.5, -0.25, 0.125])
    text = encode_features("v7", "weak", v, 1234, 0.75)
    version, decision, back, log_chars, code = decode_features(text)
    assert (version, decision) == ("v7", "weak")
    np.testing.assert_allclose(back, v, atol=1e-3)
    assert log_chars == pytest.approx(np.log1p(1234), abs=1e-2)
    assert code == 0.75
    assert len(text) < 200


def test_cost_policy_buys_quality_with_money(domains: dict) -> None:
    rows = {d: domains[d][:600] for d in ("arc_challenge", "winogrande")}
    # a stand-in for leave-one-domain-out scores: longer prompts score higher
    scores = {d: np.array([min(len(r.prompt) / 2000, 0.99) for r in rows[d]]) for d in rows}
    out = cost_quality(scores, rows)
    assert out["n"] == 1200
    for way in ("policy", "static"):
        costs = [p["usd_per_1k"] for p in out[way]]
        # a higher bar never buys a cheaper mix, and the highest costs less than always-gpt-4
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(costs))
        assert costs[-1] <= out["models"]["gpt-4-1106-preview"]["usd_per_1k"]
        assert all(sum(p["share_by_model"].values()) == pytest.approx(1.0) for p in out[way])
    with pytest.raises(ValueError):  # nothing to hold out
        cost_quality(scores, {"arc_challenge": rows["arc_challenge"]})


def test_quality_curves_recover_a_known_curve() -> None:
    """Correctness drawn from a known curve of the score's logit: the fit finds it again."""
    from tokenyard.router.training.dataset import Routed

    rng = np.random.default_rng(1)
    scores = rng.uniform(0.02, 0.98, 20_000)
    truth = QualityCurve(1.5, -0.8)
    right = rng.random(scores.size) < truth.predict(scores)
    rows = [Routed("p", "d", "s", 0.0, 1.0, {"m": float(r)}) for r in right]
    fitted = fit_curves(scores, rows)["m"]
    assert fitted.intercept == pytest.approx(1.5, abs=0.1)
    assert fitted.slope == pytest.approx(-0.8, abs=0.1)
    # a constant curve is the mean quality whatever the score
    np.testing.assert_allclose(QualityCurve.constant(0.7).predict(scores), 0.7)


def test_ratings_give_each_well_rated_model_its_own_curve(domains: dict) -> None:
    """Rated requests drawn from a known curve of the router's score: the model rated often
    enough gets that curve back; a rarely rated one and another artifact's rows get nothing."""
    clf = ComplexityClassifier.load()
    truth = QualityCurve(0.5, -1.2)
    rows = []
    prompts = [r.prompt for d in domains.values() for r in d[::37]]
    for prompt in prompts:
        scored = clf.route_score(prompt)
        decision = "weak" if scored.score < 0.5 else "strong"
        features = encode_features(
            clf.version, decision, scored.projected, len(prompt), scored.code
        )
        rows.append((features, "team-model", float(truth.predict(scored.score))))
    rows += [(rows[0][0], "rare-model", 1.0)] * 5
    rows.append(("v0" + rows[0][0][len(clf.version) :], "team-model", 0.0))  # another artifact
    rated = ratings(rows, clf)
    assert len(rated) == len(prompts) + 5
    curves = own_curves(rated, clf.scorer)
    assert set(curves) == {"team-model"}
    assert curves["team-model"].intercept == pytest.approx(0.5, abs=0.05)
    assert curves["team-model"].slope == pytest.approx(-1.2, abs=0.05)
    # only the weak class's ratings train the classifier: strong quality taken as 1
    samples = rated.samples()
    assert len(samples) == int((rated.decision == "weak").sum()) > 0
    assert (samples.strong == 1.0).all() and set(samples.domain) == {"feedback"}


def test_random_split_keeps_duplicates_together() -> None:
    mmlu = load_mmlu()
    split = random_split(mmlu, seed=0, val_frac=0.15, test_frac=0.25)
    parts = [
        {normalise(mmlu[i].prompt) for i in idx} for idx in (split.train, split.val, split.test)
    ]
    assert not parts[0] & parts[2] and not parts[1] & parts[2] and not parts[0] & parts[1]
    assert len(split.train) + len(split.val) + len(split.test) == len(mmlu)
    assert len(load_gsm8k()) == 1_307


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
    assert cpt(oracle, 0.5) == pytest.approx(gain.mean() / 2, abs=0.03)


def test_the_recipe_that_ships_routes_no_held_out_domain_worse_than_length() -> None:
    """Two domains where the weak model fails longer prompts more often. A recipe perfect on one
    and a coin on the other has the better mean but loses to the length rule on the second; the
    recipe that follows length on both ships. With no such recipe, the smallest loss wins."""
    rng = np.random.default_rng(3)
    domains = {}
    for name in ("a", "b"):
        lengths = rng.integers(10, 400, 1500)
        fails = rng.random(1500) < 0.2 + 0.5 * lengths / 400
        domains[name] = [
            Routed("x" * int(n), name, name, 0.0 if f else 1.0, 1.0)
            for n, f in zip(lengths, fails, strict=True)
        ]
    length = {d: np.array([len(r.prompt) for r in rows], float) for d, rows in domains.items()}
    oracle = {d: np.array([1.0 - r.weak for r in rows]) for d, rows in domains.items()}
    config = TrainConfig(bootstrap_resamples=200)

    def row(name: str, scores: dict[str, np.ndarray]) -> dict:
        evals = {d: evaluate(scores[d], domains[d], config, i) for i, d in enumerate(domains)}
        return selection_row(Recipe(target=name), evals)

    # perfect on a, but on b no better than a coin where length knows something
    sharp_but_unsafe = row("escalate", {"a": oracle["a"], "b": rng.random(1500)})
    safe = row("weak_fails", {"a": length["a"], "b": length["b"]})
    assert sharp_but_unsafe["mean"] > safe["mean"]  # so the mean alone would pick it
    assert not sharp_but_unsafe["never_below_length"] and sharp_but_unsafe["worst_vs_length"] < 0
    assert safe["never_below_length"]
    assert choose([sharp_but_unsafe, safe]) == 1
    # both qualify: the better mean ships
    better = dict(safe, mean=safe["mean"] + 0.01)
    assert choose([safe, better]) == 1 and choose([better, safe]) == 0
    # none qualifies: the one that loses least to length
    worse = dict(sharp_but_unsafe, worst_vs_length=sharp_but_unsafe["worst_vs_length"] - 0.1)
    assert choose([worse, sharp_but_unsafe]) == 1


def test_cli_registers_router_train() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["router", "train", "--seed", "7", "--bootstrap", "10", "--feedback"])
    assert args.seed == 7 and args.bootstrap == 10 and args.feedback and callable(args.run)
