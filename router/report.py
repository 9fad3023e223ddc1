"""The evaluation report of a trained classifier: JSON for machines, Markdown for people."""

import json
from pathlib import Path
from typing import Any

_SECTIONS = (
    ("mmlu_in_domain", "MMLU, in-domain (seeded split, test part)"),
    ("mmlu_subject_held_out", "MMLU, whole subjects held out (every prompt scored out-of-fold)"),
    ("gsm8k", "GSM8K (seeded split, test part)"),
    ("mt_bench", "MT-Bench (never trained on; 72 questions, sanity check only)"),
)
_METRICS = (("apgr", "APGR", False), ("cpt50", "CPT(50%)", True), ("cpt80", "CPT(80%)", True))


def _cell(m: dict[str, float | None], percent: bool) -> str:
    if m["value"] is None:  # undefined: AUROC on judge scores
        return "—"
    if percent:
        return f"{m['value']:.1%} [{m['low']:.1%}, {m['high']:.1%}]"
    return f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def _table(section: dict[str, Any]) -> list[str]:
    lines = [
        "| router | APGR | CPT(50%) | CPT(80%) | AUROC (weak fails) |",
        "|---|---|---|---|---|",
    ]
    for name, metrics in section["routers"].items():
        cells = [_cell(metrics[key], percent) for key, _, percent in _METRICS]
        cells.append(_cell(metrics["auroc_weak_fails"], False))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    diff = section["minus_length"]["classifier"]
    lines += [
        "",
        "Classifier minus length rule (paired bootstrap, same resampled prompts): "
        f"APGR {diff['apgr']['value']:+.3f} [{diff['apgr']['low']:+.3f}, "
        f"{diff['apgr']['high']:+.3f}], CPT(50%) {diff['cpt50']['value']:+.1%} "
        f"[{diff['cpt50']['low']:+.1%}, {diff['cpt50']['high']:+.1%}].",
    ]
    return lines


def write_report(report: dict[str, Any], metadata: dict[str, Any], stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    config = metadata["config"]
    lines = [
        f"# Complexity classifier {metadata['version']}: evaluation report",
        "",
        "Written by `tokenyard router train`. Weak model Mixtral-8x7B-Instruct-v0.1, strong "
        "gpt-4-1106-preview; per-prompt outcomes from RouteLLM (router/data/README.md), "
        "decontaminated with RouteLLM's lists. Metrics as RouteLLM defines them (11 thresholds "
        "at the score deciles); 95% bootstrap intervals over prompts "
        f"({config['bootstrap_resamples']} resamples, seed {config['seed']}). Random and length "
        "routing are computed on the same prompts in the same run.",
        "",
        f"Chosen on validation (never on test): **{metadata['chosen']['name']}**; "
        f"sklearn {metadata['sklearn_version']}; data sha256 `{metadata['data_sha256'][:16]}…`.",
        "",
        "Notes:",
        "- The label is *escalate* (the weak model fails and the strong one succeeds), which beat "
        "*weak model fails* on validation in v1's grid and in every exploratory run: a prompt "
        "both models fail gains nothing from escalation, and APGR only counts gains. AUROC below "
        "is still for *weak model fails*.",
        "- The shipped artifact is fit on the train part only; validation picks the candidate "
        "and calibrates the share → threshold curve; the test part is only reported here.",
        "- The subject-held-out rows are scored by K models of the chosen recipe, each trained "
        "without the held-out subjects (nor any verbatim duplicate of their prompts); they "
        "estimate how the recipe transfers to unseen topics, not the shipped artifact.",
        "- Length rule: prompt length in characters, longer → strong.",
        "- The model blends seven standardised scores with the weights w below: a logistic "
        "regression on TF-IDF word 1–2-grams, character 3–5-grams and text statistics; a logistic "
        "regression on the text statistics and a static embedding (mean of SmolLM2-135M's "
        "input-embedding rows over the prompt's tokens, no forward pass; folded into one weight "
        "per token after fitting); the log prompt length; the subject part (a multinomial "
        "logistic regression guesses which training subject the prompt resembles, times those "
        "subjects' mean strong − weak gain on the training prompts); gradient-boosted "
        "trees (300 of depth 3) on the text statistics alone; and a logistic regression on the "
        "first one's features learning where the *strong* model fails (weighted negatively: "
        "escalating a prompt both models fail gains nothing); and a word-problem expert (a "
        "logistic regression on word-problem statistics, fitted on the GSM8K training prompts "
        "alone and centred on them), times a gate on the subject model's probability that the "
        "prompt is a GSM8K-like word problem (0 up to 0.1, so the expert is not consulted on "
        "prompts only faintly like one, then rising linearly to 1). A part of weight 0 in the "
        "chosen "
        "blend is not fitted into the artifact nor computed when scoring.",
        "- The selection's subject-transfer estimate uses MMLU's train and validation parts, which "
        "the subject-held-out evaluation below also scores (it covers all of MMLU by definition); "
        "its folds group the subjects differently, and only the blend weights and the "
        "strong-fails LR's C are chosen with it.",
        "",
        "Selection score = "
        + " + ".join(
            f"{w:g}·{n}"
            for w, n in zip(
                config["selection_weights"],
                ("val APGR MMLU", "val APGR GSM8K", "subject-transfer APGR"),
                strict=True,
            )
        )
        + "; subject-transfer APGR: MMLU train+validation parts only, in subject folds grouped "
        "differently from the evaluation below (seed "
        f"{config['seed'] + config['selection_fold_seed_offset']}), each fold scored by a model "
        "trained on the other subjects. Weights w = (n-gram LR, dense LR, log length, "
        "subject gain, boosted trees, strong-fails LR, word-problem expert).",
        "",
        "| candidate | val APGR MMLU | val APGR GSM8K | subject-transfer APGR | selection score |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {v['candidate']} | {v['mmlu']:.3f} | {v['gsm8k']:.3f} | "
        f"{v['subject_transfer']:.3f} | {v['selection']:.3f} |"
        for v in metadata["validation"]
    ]
    for key, title in _SECTIONS:
        section = report["evaluations"][key]
        lines += [
            "",
            f"## {title}",
            "",
            f"{section['n']} prompts; always-weak quality {section['weak_quality']:.3f}, "
            f"always-strong {section['strong_quality']:.3f}.",
            "",
            *_table(section),
        ]
        if "folds" in section:
            lines += ["", "| fold | prompts | APGR | subjects |", "|---|---|---|---|"]
            lines += [
                f"| {f['fold']} | {f['n']} | {f['apgr']:.3f} | {', '.join(f['subjects'])} |"
                for f in section["folds"]
            ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
