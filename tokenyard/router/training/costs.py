"""Cost against quality on RouterBench's prompts, where every one of 11 models has an answer and a
price: the cheapest model whose predicted quality clears a bar, next to always using one model
and to the same choice made without a router (each model's mean quality).

Held out by domain, like the rest of the report: the quality curves are fitted on one domain's
prompts and the policy is scored on another's, with the leave-one-domain-out scores (those of a
classifier that saw neither). Costs are RouterBench's own, per call; the price order is the
fitting domain's mean cost per call, as a catalog's list prices would give it.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression

from tokenyard.router.features import Ratings
from tokenyard.router.quality import QualityCurve, cheapest_clearing, logit
from tokenyard.router.scorer import CompiledScorer
from tokenyard.router.training.dataset import Routed

BARS = (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
Curves = dict[str, QualityCurve]


def fit_curve(scores: np.ndarray, quality: np.ndarray) -> QualityCurve:
    """A model's quality (correctness, or a rating in [0, 1]) against the score's logit. A rating
    q counts as a right answer of weight q and a wrong one of weight 1 - q: the logistic fit of
    fractional labels."""
    z = logit(np.asarray(scores))[:, None]
    quality = np.asarray(quality, dtype=float)
    fitted = LogisticRegression().fit(
        np.vstack([z, z]),
        np.r_[np.ones(len(z)), np.zeros(len(z))],
        sample_weight=np.r_[quality, 1.0 - quality],
    )
    return QualityCurve(float(fitted.intercept_[0]), float(fitted.coef_[0, 0]))


def fit_curves(scores: np.ndarray, rows: Sequence[Routed]) -> Curves:
    """One curve per model whose correctness every row has (RouterBench's prompts)."""
    if not rows or any(r.correct is None for r in rows):
        raise ValueError("quality curves need every model's correctness on every prompt")
    return {
        model: fit_curve(scores, np.array([r.correct[model] for r in rows]))  # type: ignore[index]
        for model in sorted(rows[0].correct)  # type: ignore[arg-type]
    }


# ratings of one model before its own curve replaces its catalog reference's
MIN_CURVE_ROWS = 100


def own_curves(ratings: Ratings, scorer: CompiledScorer, min_rows: int = MIN_CURVE_ROWS) -> Curves:
    """Every rated request says how well the model that served it did at its score: each model
    rated at least `min_rows` times gets its own curve, keyed by its catalog id, against `scorer`
    (the artifact that will serve the curves), which the cost-aware choice prefers to its
    `quality_reference` (router/quality.py). Auto sent each model the scores its class gets, so
    such a curve is measured over that range and extrapolated beyond it."""
    views = zip(ratings.raw, ratings.log_chars, ratings.code, strict=True)
    scores = np.array([scorer.score_raw(r, c, k) for r, c, k in views])
    return {
        str(m): fit_curve(scores[ratings.model == m], ratings.rating[ratings.model == m])
        for m in np.unique(ratings.model)
        if (ratings.model == m).sum() >= min_rows
    }


def _static(rows: list[Routed]) -> Curves:
    models = sorted(rows[0].correct)  # type: ignore[arg-type]
    return {m: QualityCurve.constant(np.mean([r.correct[m] for r in rows])) for m in models}  # type: ignore[index]


def _matrix(rows: list[Routed], field: str, models: list[str]) -> np.ndarray:
    return np.array([[getattr(r, field)[m] for m in models] for r in rows])


def cost_quality(scores: dict[str, np.ndarray], by_domain: dict[str, list[Routed]]) -> dict:
    """`scores`: each domain's prompts scored by a classifier fitted without it; at least two
    domains, each held out in turn with the curves fitted on the others."""
    if len(by_domain) < 2:
        raise ValueError("cost against quality holds a domain out: it needs two or more")
    rows = [r for d in by_domain for r in by_domain[d]]
    if any(r.correct is None or r.cost is None for r in rows):
        raise ValueError("cost against quality needs every model's correctness and cost")
    models = sorted(rows[0].correct)  # type: ignore[arg-type]
    ways: dict[str, Callable[[np.ndarray, list[Routed]], Curves]] = {
        "policy": fit_curves,
        "static": lambda _, fit_rows: _static(fit_rows),
    }
    chosen: dict[str, dict[float, list[np.ndarray]]] = {w: {b: [] for b in BARS} for w in ways}
    for held in by_domain:
        others = [d for d in by_domain if d != held]
        fit_rows = [r for d in others for r in by_domain[d]]
        fit_scores = np.concatenate([scores[d] for d in others])
        by_price = np.argsort(_matrix(fit_rows, "cost", models).mean(axis=0), kind="stable")
        for way, make in ways.items():
            curves = make(fit_scores, fit_rows)
            predicted = np.column_stack([curves[models[j]].predict(scores[held]) for j in by_price])
            for bar in BARS:
                picks = [by_price[cheapest_clearing(row, bar)] for row in predicted]
                chosen[way][bar].append(np.array(picks))

    correct, cost = _matrix(rows, "correct", models), _matrix(rows, "cost", models)
    idx = np.arange(len(rows))

    def scored(choice: np.ndarray, bar: float) -> dict[str, Any]:
        return {
            "bar": bar,
            "quality": float(correct[idx, choice].mean()),
            "usd_per_1k": float(cost[idx, choice].mean() * 1000),
            "share_by_model": {
                models[j]: float((choice == j).mean())
                for j in range(len(models))
                if (choice == j).any()
            },
        }

    out: dict[str, Any] = {
        "n": len(rows),
        "domains": list(by_domain),
        "models": {
            m: {
                "quality": float(correct[:, j].mean()),
                "usd_per_1k": float(cost[:, j].mean() * 1000),
            }
            for j, m in enumerate(models)
        },
    }
    for way in ways:
        out[way] = [scored(np.concatenate(chosen[way][b]), b) for b in BARS]
    return out
