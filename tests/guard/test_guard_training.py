"""`tokenyard guard train` end to end on a sample of the data (the split, the fits, the report and
the artifact, which scores as the fitted model did), and its leave-one-source-out loop on four
families."""

import json
import random
from pathlib import Path

import numpy as np

from tokenyard.guard.classifier import SafetyClassifier
from tokenyard.guard.taxonomy import HEADS
from tokenyard.guard.training.dataset import (
    BENIGN_CAP,
    EVAL_DIR,
    UNSAFE,
    UPSTREAM,
    _rows_assistant_requests,
    _rows_benchmark_questions,
    _rows_gpteacher,
    load,
)
from tokenyard.guard.training.train import (
    TrainConfig,
    evaluate,
    featurize,
    labels_matrix,
    loso,
    raw_table,
    scary_benign,
    split_of,
    train,
)
from tokenyard.router.embedding import WordPieces, tokenizer_json


def test_train_writes_a_loadable_artifact_and_its_report(tmp_path: Path) -> None:
    report = train(TrainConfig(max_rows=1500, loso=False, jobs=2), tmp_path)
    assert report["artifact_max_abs_diff"] < 1e-2  # float16 storage
    for section in ("test",):
        binary = report[section]["binary"]
        assert set(binary) == {
            "harmful_vs_benign_input",
            "jailbreak_vs_benign_input",
            "harmful_vs_benign_output",
        }
        assert binary["harmful_vs_benign_input"]["auprc"] is not None
        assert set(report[section]["categories"]) == set(HEADS)
        assert "xstest" in report[section]["over_refusal"] or section == "test"
    clf = SafetyClassifier.load(tmp_path / "guard-v3.joblib")
    assert set(clf.scores("hello")) == set(HEADS)
    md = (tmp_path / "guard-v3-report.md").read_text()
    assert "Held-out test split" in md and "over-refusal" in md
    # the evaluation-only replies, scored by the shipped model
    replies = report["unseen_replies"]
    assert {s: (m["replies"], m["unsafe"]) for s, m in replies.items()} == {
        "dices-350-expert": (350, 175),
        "dices-990": (990, 160),
    }
    assert all(0 < m["auprc"] <= 1 and 0 <= m["safe_flagged_rate"] <= 1 for m in replies.values())
    assert "Replies from a source no model trained on" in md
    # ordinary prompts no guard model trains on: exam questions, and code (CRUXEval)
    unseen = report["unseen_benign"]
    assert {d: m["prompts"] for d, m in unseen.items()} == {
        "arc_challenge": 1456,
        "winogrande": 1267,
        "crux": 800,
    }
    assert all(0 <= m["jailbreak_flagged_rate"] <= m["flagged_rate"] <= 1 for m in unseen.values())
    assert json.loads((tmp_path / "guard-v3-report.json").read_text())["version"] == "v3"


def test_leave_one_source_out_scores_every_row_with_a_model_blind_to_its_family() -> None:
    rng = random.Random(0)
    rows = []
    for source in ("xstest", "toxigen", "gsm8k", "jbb-jailbreaks"):
        rows += rng.sample([r for r in load() if r.source == source], 150)
    config = TrainConfig(jobs=2)
    f = featurize(rows, raw_table(), WordPieces(tokenizer_json()))
    y = labels_matrix(rows)
    split = np.array([split_of(r, config) for r in rows])
    scores, thresholds, families, per_family = loso(
        rows, f, y, scary_benign(rows, y), split, config
    )
    assert per_family["xstest"]["harmful_vs_benign_input"]["auprc"] is not None
    assert "harmful_vs_benign_input" not in per_family["gsm8k+nq-open"]  # no positives there
    assert families == ["gsm8k+nq-open", "jailbreakbench", "toxigen", "xstest"]
    assert scores.shape == thresholds.shape == (len(rows), len(HEADS))
    assert ((scores > 0) & (scores < 1)).all() and ((thresholds >= 0.5) & (thresholds < 1)).all()
    report = evaluate(rows, y, scores, thresholds)
    assert report["over_refusal"]["xstest"]["benign"] > 0


def test_evaluation_only_replies_are_kept_apart_from_training() -> None:
    """DICES' rated replies ship in guard/data/eval, which training never reads: no row of it
    is among the training rows, and each is a reply labelled unsafe or not at all."""
    held = load(EVAL_DIR)
    assert len(held) == 1340 and {r.direction for r in held} == {"output"}
    assert {tuple(r.labels) for r in held} == {(UNSAFE,), ()}
    trained = load()
    assert not {r.text for r in held} & {r.text for r in trained}
    assert not any(UNSAFE in r.labels for r in trained)


def test_splits_keep_groups_together() -> None:
    config = TrainConfig()
    sides: dict[tuple[str, str], set[str]] = {}
    for row in load():
        sides.setdefault((row.source, row.group), set()).add(split_of(row, config))
    assert all(len(s) == 1 for s in sides.values())
    assert {next(iter(s)) for s in sides.values()} == {"train", "val", "test"}


def test_shipped_data_is_decontaminated() -> None:
    """No shipped row is one DECONTAMINATE.jsonl names (by its locator in the source file)."""
    rows = load()
    dropped = {("gsm8k", "test:9"), ("simplesafetytests", "sst_032")}
    assert not any((r.source, r.group) in dropped for r in rows)
    assert len(rows) == 33250


def test_sets_kept_in_the_project_rebuild_the_shipped_rows() -> None:
    """The rows of the sets kept in guard/data/upstream and taken from the router's data are what
    their sources give (MMLU's are a sample of them), all benign."""
    built = [
        *_rows_assistant_requests(UPSTREAM),
        *_rows_gpteacher(UPSTREAM),
        *_rows_benchmark_questions(),
    ]
    sources = {r.source for r in built}
    assert sources == {
        "self-instruct",
        "ifeval",
        "ifeval-replies",
        "gpteacher-roleplay",
        "gpteacher-code",
        "mmlu",
        "mt-bench",
    }
    key = lambda r: (r.source, r.group, r.direction, r.text)  # noqa: E731
    shipped = [r for r in load() if r.source in sources]
    assert {key(r) for r in shipped} <= {key(r) for r in built}
    assert not any(r.labels for r in shipped)
    for source in sources - set(BENIGN_CAP):
        assert sum(r.source == source for r in shipped) == sum(r.source == source for r in built)
    for source in sources & set(BENIGN_CAP):
        assert sum(r.source == source for r in shipped) == BENIGN_CAP[source]
    assert {r.direction for r in shipped if r.source == "ifeval-replies"} == {"output"}
