"""The training report: JSON (every number) and Markdown (the tables people read)."""

import json
from pathlib import Path
from typing import Any


def _f(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def _section(title: str, ev: dict[str, Any]) -> list[str]:
    lines = [f"## {title}", "", f"{ev['rows']} rows.", ""]
    lines += [
        "| binary | positives | negatives | AUPRC | precision | recall |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in ev["binary"].items():
        lines.append(
            f"| {name} | {m['positives']} | {m['negatives']} | {_f(m['auprc'])} | "
            f"{_f(m['precision'])} | {_f(m['recall'])} |"
        )
    lines += ["", "| over-refusal set | benign prompts | flagged |", "|---|---|---|"]
    for src, m in ev["over_refusal"].items():
        lines.append(f"| {src} | {m['benign']} | {_f(m['flagged_rate'])} |")
    lines += ["", "| category | positives | AUPRC | precision | recall |", "|---|---|---|---|---|"]
    for head, m in ev["categories"].items():
        lines.append(
            f"| {head} | {m['positives']} | {_f(m['auprc'])} | {_f(m['precision'])} | "
            f"{_f(m['recall'])} |"
        )
    lines += [
        "",
        "| source | rows | harmful | jailbreak | benign | harmful recall | jailbreak recall | "
        "benign flagged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for src, m in ev["by_source"].items():
        lines.append(
            f"| {src} | {m['rows']} | {m['harmful']} | {m['jailbreak']} | {m['benign']} | "
            f"{_f(m['harmful_recall'])} | {_f(m['jailbreak_recall'])} | "
            f"{_f(m['benign_flagged_rate'])} |"
        )
    return [*lines, ""]


def write_report(report: dict[str, Any], stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Safety classifier {report['version']}: training report",
        "",
        "Written by `tokenyard guard train` (guard/training/train.py). Splits are by group within "
        "each source (70/10/20); thresholds are set on the validation split; the test split and "
        "the leave-one-source-out (LOSO) scores are never used to choose anything. Flagged: the "
        "jailbreak head, or a category, at or over its threshold; a category only where the "
        "harmful head (any category) is over its own too, and its score is at most that head's. "
        "Over-refusal: the share of benign-but-scary prompts flagged. Pooled LOSO: each family's "
        "rows are scored by a different model, so their scores are pooled across models.",
        "",
        f"Data hash {report['data_hash']}; rows {report['rows']}; trained in "
        f"{report['trained_s']} s; artifact vs fitted model, max |score difference| "
        f"{report['artifact_max_abs_diff']:.2e}.",
        "",
        "| head | threshold |",
        "|---|---|",
        *(f"| {h} | {t:.3f} |" for h, t in report["thresholds"].items()),
        "",
    ]
    lines += _section("Held-out test split", report["test"])
    lines += [
        "## Ordinary prompts from sets no model trained on",
        "",
        "The router's exam questions (guard/training/train.py `UNSEEN_BENIGN`) and its "
        "code-reasoning questions (`UNSEEN_CODE`: CRUXEval), scored by the shipped model: every "
        "one is benign, so every flag is a false positive.",
        "",
        "| set | prompts | flagged | flagged as jailbreak |",
        "|---|---|---|---|",
        *(
            f"| {name} | {m['prompts']} | {_f(m['flagged_rate'])} | "
            f"{_f(m['jailbreak_flagged_rate'])} |"
            for name, m in report["unseen_benign"].items()
        ),
        "",
        "## Replies from a source no model trained on",
        "",
        "DICES (guard/data/eval): a chatbot's last turn in adversarial conversations, rated for "
        'the whole conversation\'s safety (its "unsafe" is broader than this taxonomy: bias and '
        "misinformation too), scored alone as the output check reads a reply. AUPRC of the "
        "harmful head; flagged: any category at the default thresholds.",
        "",
        "| set | replies | unsafe | AUPRC | precision | recall | safe flagged |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {m['replies']} | {m['unsafe']} | {_f(m['auprc'])} | "
            f"{_f(m['precision'])} | {_f(m['recall'])} | {_f(m['safe_flagged_rate'])} |"
            for name, m in report["unseen_replies"].items()
        ),
        "",
    ]
    if "loso" in report:
        lines += _section(
            "Leave one source out (every row scored by a model that never saw its source family)",
            report["loso"],
        )
        if "by_family" in report["loso"]:
            lines += [
                "### Leave one source out, one model at a time",
                "",
                "Each family's positives against benign texts the same model never saw (the "
                "family's own and every other family's test-split benign texts); the mean is "
                "weighted by positives.",
                "",
                "| held-out family | harmful input (positives, AUPRC) | jailbreak input | "
                "harmful output |",
                "|---|---|---|---|",
            ]
            for name, m in report["loso"]["by_family"].items():
                cells = []
                for metric in (
                    "harmful_vs_benign_input",
                    "jailbreak_vs_benign_input",
                    "harmful_vs_benign_output",
                ):
                    got = m.get(metric)
                    cells.append(f"{got['positives']}, {_f(got['auprc'])}" if got else "–")
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            means = report["loso"]["family_mean"]
            lines.append("| **weighted mean** | " + " | ".join(_f(means[k]) for k in means) + " |")
            lines.append("")
    stem.with_suffix(".md").write_text("\n".join(lines))
