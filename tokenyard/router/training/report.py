"""The evaluation report of a trained classifier: JSON for machines, Markdown for people."""

import json
from pathlib import Path
from typing import Any

from tokenyard.router.training.dataset import DOMAINS

_TITLES = {
    "mmlu": "MMLU",
    "gsm8k": "GSM8K",
    "mt_bench": "MT-Bench (72 questions: a sanity check)",
    "arc_challenge": "ARC-Challenge",
    "winogrande": "Winogrande",
    "crux": "CRUXEval (code; Mixtral-8x7B-Instruct weak, gpt-4-turbo-2024-04-09 strong)",
}
_METRICS = (("apgr", "APGR", False), ("cpt50", "CPT(50%)", True), ("cpt80", "CPT(80%)", True))


def _cell(m: dict[str, float | None], percent: bool, sign: str = "") -> str:
    if m["value"] is None:  # undefined: AUROC on judge scores
        return "—"
    f = f"{sign}.1%" if percent else f"{sign}.3f"
    return f"{m['value']:{f}} [{m['low']:{f}}, {m['high']:{f}}]"


def _table(section: dict[str, Any]) -> list[str]:
    lines = [
        f"{section['n']} prompts; always-weak quality {section['weak_quality']:.3f}, "
        f"always-strong {section['strong_quality']:.3f}.",
        "",
        "| router | APGR | CPT(50%) | CPT(80%) |",
        "|---|---|---|---|",
    ]
    for name, metrics in section["routers"].items():
        cells = [_cell(metrics[key], percent) for key, _, percent in _METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    diff = section["minus_length"]["classifier"]
    lines += [
        "",
        "Classifier minus length rule (paired bootstrap): APGR "
        f"{_cell(diff['apgr'], False, '+')}, CPT(50%) {_cell(diff['cpt50'], True, '+')}.",
    ]
    return lines


def _summary(evaluations: dict[str, Any]) -> list[str]:
    lines = [
        "| held-out domain | n | classifier APGR | length APGR | random APGR "
        "| classifier − length | CPT(50%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in DOMAINS:
        s = evaluations["lodo"][d]
        r = s["routers"]
        lines.append(
            f"| {_TITLES[d].split(' (')[0]} | {s['n']} | {_cell(r['classifier']['apgr'], False)} "
            f"| {_cell(r['length']['apgr'], False)} | {_cell(r['random']['apgr'], False)} "
            f"| {_cell(s['minus_length']['classifier']['apgr'], False, '+')} "
            f"| {_cell(r['classifier']['cpt50'], True)} |"
        )
    return lines


def _costs(cq: dict[str, Any]) -> list[str]:
    lines = [
        f"{cq['n']} prompts of {', '.join(cq['domains'])}, each domain held out in turn: its "
        "prompts scored by the classifier fitted without it, and the quality curves fitted on the "
        "other domain. *Without the router*: the same bar on each model's mean quality there.",
        "",
        "| bar | with the router: quality | USD per 1,000 | without: quality | USD per 1,000 "
        "| models the router used |",
        "|---|---|---|---|---|---|",
    ]
    for p, s in zip(cq["policy"], cq["static"], strict=True):
        used = ", ".join(f"{m} {v:.0%}" for m, v in p["share_by_model"].items())
        lines.append(
            f"| {p['bar']:g} | {p['quality']:.3f} | {p['usd_per_1k']:.3f} | {s['quality']:.3f} "
            f"| {s['usd_per_1k']:.3f} | {used} |"
        )
    lines += ["", "| always | quality | USD per 1,000 |", "|---|---|---|"]
    for m, v in sorted(cq["models"].items(), key=lambda kv: kv[1]["usd_per_1k"]):
        lines.append(f"| {m} | {v['quality']:.3f} | {v['usd_per_1k']:.3f} |")
    return lines


def write_report(report: dict[str, Any], metadata: dict[str, Any], stem: Path) -> None:
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    config = metadata["config"]
    evaluations = report["evaluations"]
    lines = [
        f"# Complexity classifier {metadata['version']}: evaluation report",
        "",
        "Written by `tokenyard router train`. Every domain is routed between the same two models: "
        "Mixtral-8x7B-Instruct (weak) and gpt-4-1106-preview (strong); MMLU, GSM8K and MT-Bench "
        "outcomes from RouteLLM, ARC-Challenge and Winogrande from RouterBench "
        "(router/data/README.md). Label *escalate*: the strong model's quality exceeds the weak "
        "one's by more than 0.05 (on correctness: strong right, weak wrong; on MT-Bench: more than "
        "half a judge point); *weak_fails*: the weak model's quality is under 0.8 (a wrong answer, "
        "a judge score under 8). Metrics as RouteLLM defines them (11 thresholds at the score "
        "deciles); 95% bootstrap intervals over prompts "
        f"({config['bootstrap_resamples']} resamples, seed {config['seed']}); random and length "
        "routing scored on the same prompts in the same run, the length rule being prompt length "
        "in characters, longer → strong.",
        "",
        "Chosen by leave-one-domain-out APGR: the best mean among the recipes that route no "
        "held-out domain worse than the length rule (no paired interval wholly below 0), or, "
        "where none qualifies, the one whose worst domain loses least to it: "
        f"**{metadata['chosen']['name']}**; "
        f"sklearn {metadata['sklearn_version']}; data sha256 `{metadata['data_sha256'][:16]}…`; "
        f"feedback rows {metadata['feedback_rows']}; quality curves from the platform's "
        f"ratings: {', '.join(metadata['feedback_curves']) or 'none'}.",
        "",
        "## Leave one domain out",
        "",
        "Each domain scored whole by a model of the chosen recipe fitted on the other four "
        "domains only, OOD guard included (what ships scores the same way).",
        "",
        *_summary(evaluations),
        "",
        "Every recipe tried (these LODO numbers chose; the same numbers are reported above, so "
        "they are a little optimistic for the chosen one). *vs length*: the worst domain's "
        "paired APGR difference from the length rule; *never below*: no domain's interval of that "
        "difference lies wholly below 0:",
        "",
        "| recipe | "
        + " | ".join(_TITLES[d].split(" (")[0] for d in DOMAINS)
        + " | mean | vs length | never below |",
        "|---|" + "---|" * (len(DOMAINS) + 3),
    ]
    lines += [
        f"| {s['recipe']} | "
        + " | ".join(f"{s['apgr'][d]:.3f}" for d in DOMAINS)
        + f" | {s['mean']:.3f} | {s['worst_vs_length']:+.3f} | "
        + ("yes" if s["never_below_length"] else "no")
        + " |"
        for s in metadata["selection"]
    ]
    for d in DOMAINS:
        lines += ["", f"### Held out: {_TITLES[d]}", "", *_table(evaluations["lodo"][d])]
    mixed = evaluations["mixed"]
    lines += [
        "",
        "## The held-out domains as one mixed set",
        "",
        "Traffic mixes kinds of prompts, and a router ranks them against each other as well as "
        "within each kind. The same leave-one-domain-out scores (each prompt scored by the model "
        "that never saw its domain), of "
        + ", ".join(_TITLES[d] for d in mixed["domains"])
        + ", as many prompts of each as the smallest has, drawn at random, routed as one set.",
        "",
        *_table(mixed),
    ]
    lines += [
        "",
        "## In domain (secondary)",
        "",
        "The shipped model (fitted on the train parts of every domain) on each domain's test part.",
    ]
    for d, section in evaluations["in_domain"].items():
        lines += ["", f"### {_TITLES[d]}, test part", "", *_table(section)]
    lines += [
        "",
        "## Domains no model trained on",
        "",
        "The shipped model on a kind of prompt absent from every training domain "
        "(router/training/probes.py): the OOD guard should hand such prompts to the length rule "
        "rather than let the model rank them on features that do not carry over. Its confidence "
        "is 1 where the model's score stands, 0 where the length rule's does.",
    ]
    for name, section in evaluations["unseen"].items():
        low, mid, high = section["confidence"]
        lines += [
            "",
            f"### {_TITLES[name]}",
            "",
            f"Guard confidence, 10th / 50th / 90th percentile: {low:.2f} / {mid:.2f} / {high:.2f}.",
            "",
            *_table(section),
        ]
    lines += ["", "## Cost against quality", "", *_costs(evaluations["cost_quality"])]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
