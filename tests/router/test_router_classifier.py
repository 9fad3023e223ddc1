"""The shipped artifact: it loads, scores sensibly, its OOD guard holds, its thresholds calibrate,
its report recomputes from it, its quality curves cover the catalog."""

import itertools
import math

import numpy as np
import pytest

from tokenyard.router.catalog import DEFAULT_CATALOG, Catalog
from tokenyard.router.training.dataset import random_split
from tokenyard.router.training.evaluation import router_metrics
from tokenyard.router.training.probes import load_probe
from tokenyard.router.training.train import prompts_hash

from .conftest import Shipped

ODD = ["", "hi", "   ", "x " * 50_000, "Ünïcödé ✓ — 3½ × 10⁻³?", "\n\nA. \nB. \nAnswer:"]
# nothing like any training prompt: an unknown script, symbol soup
FAR = ["ᚠᚢᚦᚨᚱᚲ ᚷᚹᚺᚾᛁ ᛃᛇᛈᛉᛊ " * 20, "}}}{{{]]][[[" * 50, "☃☄★☆ " * 40, "🙂🙃 " * 40]
# unlike the benchmarks, but text: the guard must not shrink them to nothing, nor widen them
ODD_TEXT = ["0x7f 0x45 0x4c 0x46 0x02 0x01 " * 30, "zzz qqq xxj vvk " * 40]


def test_loads_and_scores_in_unit_interval(shipped: Shipped) -> None:
    clf = shipped.classifier
    assert clf.version == "v7"
    for prompt in [*ODD, shipped.domains["gsm8k"][0].prompt]:
        scored = clf.route_score(prompt)
        assert 0.0 < scored.score < 1.0 and 0.0 <= scored.confidence <= 1.0
        assert scored.score == clf.score(prompt)


def test_a_prompt_far_from_training_gets_the_prior(shipped: Shipped) -> None:
    """The OOD guard: far from every training prompt, the score is the length rule's, never more
    extreme; and no prompt's score is ever further from the prior than the model puts it."""
    scorer = shipped.classifier.scorer
    for prompt in [*FAR, "", "   "]:
        scored = scorer.route_score(prompt)
        assert scored.confidence == 0.0, prompt[:40]
        assert scored.score == pytest.approx(scored.prior, abs=1e-12)
    prompts = [r.prompt for d in shipped.domains.values() for r in d[::97]]
    prompts += [*FAR, *ODD, *ODD_TEXT]
    for prompt in prompts:
        scored = scorer.route_score(prompt)
        model, _, _ = scorer.parts_of(scored.projected, math.log1p(len(prompt)), scored.code)
        model_score = 1 / (1 + np.exp(-model))
        low, high = sorted((scored.prior, model_score))
        assert low - 1e-12 <= scored.score <= high + 1e-12


def test_code_gets_the_prior(shipped: Shipped) -> None:
    """No training domain is code, and the embedding alone took code for familiar text (every
    CRUXEval prompt had full confidence under v6): the share of code lines hands it to the prior."""
    scorer = shipped.classifier.scorer
    for row in load_probe("crux")[::40]:
        scored = scorer.route_score(row.prompt)
        assert scored.code >= 0.5 and scored.confidence == 0.0
        assert scored.score == pytest.approx(scored.prior, abs=1e-12)
    # a question that quotes a line of code keeps part of the model's say
    prompt = "What does this line of our build do?\nflags = compute(a, b)\nBe brief.\nThanks."
    assert 0.0 < scorer.route_score(prompt).confidence <= 1.0


def test_training_prompts_get_full_confidence_mostly(shipped: Shipped) -> None:
    sample = [r.prompt for r in shipped.domains["mmlu"][::20]]
    confidence = np.array([shipped.classifier.route_score(p).confidence for p in sample])
    assert (confidence == 1.0).mean() > 0.8


def test_long_prompts_embed_only_their_edges(shipped: Shipped) -> None:
    pieces = shipped.classifier.scorer.pieces
    middle = "lorem ipsum dolor " * 5000
    a = pieces.ids("question first. " * 100 + middle + " last question?" * 100)
    b = pieces.ids("question first. " * 100 + middle.upper() + " last question?" * 100)
    assert a == b and len(a) < 1000


def test_threshold_curve_is_monotone(shipped: Shipped) -> None:
    clf = shipped.classifier
    thresholds = [clf.threshold_for_strong_share(s) for s in np.linspace(0, 1, 201)]
    assert all(a >= b for a, b in itertools.pairwise(thresholds))
    with pytest.raises(ValueError):
        clf.threshold_for_strong_share(1.5)


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_calibrated_threshold_realises_share_on_held_out(shipped: Shipped, share: float) -> None:
    # calibrated on the validation parts, checked on the test parts it never saw
    config = shipped.classifier.metadata["config"]
    test = [
        r.prompt
        for d, rows in shipped.domains.items()
        if d != "mt_bench"
        for i in random_split(rows, config["seed"], config["val_frac"], config["test_frac"]).test
        for r in [rows[i]]
    ]
    scores = shipped.classifier.scorer.scores(test)
    realised = float((scores >= shipped.classifier.threshold_for_strong_share(share)).mean())
    assert abs(realised - share) <= 0.04


def test_report_recomputes_from_shipped_artifact(shipped: Shipped) -> None:
    config = shipped.classifier.metadata["config"]
    for name in ("mmlu", "gsm8k", "arc_challenge", "winogrande"):
        rows = shipped.domains[name]
        split = random_split(rows, config["seed"], config["val_frac"], config["test_frac"])
        test = [rows[i] for i in split.test]
        assert prompts_hash(test) == shipped.classifier.metadata["test_prompts_sha256"][name]
        weak, strong = np.array([r.weak for r in test]), np.array([r.strong for r in test])
        scores = shipped.classifier.scorer.scores([r.prompt for r in test])
        got = router_metrics(scores, weak, strong)
        reported = shipped.report["evaluations"]["in_domain"][name]["routers"]["classifier"]
        assert got.apgr == pytest.approx(reported["apgr"]["value"], abs=1e-9)


def test_report_holds_every_domain_left_out(shipped: Shipped) -> None:
    lodo = shipped.report["evaluations"]["lodo"]
    assert set(lodo) == {"mmlu", "gsm8k", "mt_bench", "arc_challenge", "winogrande"}
    for section in lodo.values():
        assert {"classifier", "length", "random"} <= set(section["routers"])
        diff = section["minus_length"]["classifier"]["apgr"]
        assert diff["low"] <= diff["value"] <= diff["high"]
        # the shipped recipe routes no held-out domain worse than the length rule (router.train
        # choose): the OOD guard's prior is the floor for a domain it never saw
        assert diff["high"] >= 0


def test_report_routes_the_held_out_domains_as_one_mixed_set(shipped: Shipped) -> None:
    mixed = shipped.report["evaluations"]["mixed"]
    assert mixed["domains"] == ["mmlu", "gsm8k", "arc_challenge", "winogrande"]
    assert mixed["n"] == 4 * min(len(shipped.domains[d]) for d in mixed["domains"])
    assert {"classifier", "length", "random"} <= set(mixed["routers"])
    diff = mixed["minus_length"]["classifier"]["apgr"]
    assert diff["low"] <= diff["value"] <= diff["high"]


def test_report_routes_a_domain_no_model_trained_on(shipped: Shipped) -> None:
    section = shipped.report["evaluations"]["unseen"]["crux"]
    rows = load_probe("crux")
    assert section["n"] == len(rows) == 800
    scores = shipped.classifier.scorer.scores([r.prompt for r in rows])
    weak, strong = np.array([r.weak for r in rows]), np.array([r.strong for r in rows])
    got = router_metrics(scores, weak, strong)
    assert got.apgr == pytest.approx(section["routers"]["classifier"]["apgr"]["value"], abs=1e-9)
    # code is routed by the length rule: the guard's confidence is 0 throughout
    assert section["confidence"] == [0.0, 0.0, 0.0]


def test_quality_curves_cover_the_catalog_and_rank_models_as_the_data_does(
    shipped: Shipped,
) -> None:
    """Every quality_reference of the shipped catalog has a curve; each curve falls as the score
    rises (the score says the weak model fails), and gpt-4's lies above Mixtral's everywhere."""
    curves = shipped.classifier.quality_curves
    references = {m.quality_reference for m in Catalog.load(DEFAULT_CATALOG).models.values()}
    assert references - {""} <= set(curves) and len(curves) == 11
    scores = np.linspace(0.01, 0.99, 50)
    for model, curve in curves.items():
        assert np.all(np.diff(curve.predict(scores)) < 0), model
    strong, weak = curves["gpt-4-1106-preview"], curves["mistralai/mixtral-8x7b-chat"]
    assert np.all(strong.predict(scores) > weak.predict(scores))
