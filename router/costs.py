"""Cost against quality on RouterBench's prompts, where every one of 11 models has an answer and a
price: the cheapest model whose predicted quality clears a bar, next to always using one model.

Each model's quality is predicted from the router's score alone: a one-feature logistic
regression of the model's correctness on the score's logit, fitted on one half of the prompts
(seeded), so the policy is evaluated on the other half. Costs are RouterBench's own, per call.
"""

from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression

from router.dataset import Routed
from router.scorer import CompiledScorer

BARS = (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def cost_quality(by_domain: dict[str, list[Routed]], scorer: CompiledScorer, seed: int = 0) -> dict:
    rows = [r for rows in by_domain.values() for r in rows]
    if any(r.correct is None or r.cost is None for r in rows):
        raise ValueError("cost against quality needs every model's correctness and cost")
    models = sorted(rows[0].correct)  # type: ignore[arg-type]
    z = _logit(scorer.scores([r.prompt for r in rows]))[:, None]
    correct = np.array([[r.correct[m] for m in models] for r in rows])  # type: ignore[index]
    cost = np.array([[r.cost[m] for m in models] for r in rows])  # type: ignore[index]
    half = np.random.default_rng(seed).permutation(len(rows)) < len(rows) // 2
    fit, held = half, ~half
    predicted = np.column_stack(
        [
            LogisticRegression().fit(z[fit], correct[fit, j]).predict_proba(z[held])[:, 1]
            for j in range(len(models))
        ]
    )
    # the price order a catalog gives: mean cost per call on the fitting half
    by_price = np.argsort(cost[fit].mean(axis=0), kind="stable")
    out: dict[str, Any] = {
        "n": int(held.sum()),
        "domains": sorted(by_domain),
        "models": {
            m: {
                "quality": float(correct[held, j].mean()),
                "usd_per_1k": float(cost[held, j].mean() * 1000),
            }
            for j, m in enumerate(models)
        },
        "policy": [],
    }
    n = int(held.sum())
    for bar in BARS:
        clears = predicted[:, by_price] >= bar
        # the cheapest that clears the bar; none does: the one predicted best
        first = np.where(clears.any(axis=1), clears.argmax(axis=1), -1)
        best = predicted.argmax(axis=1)
        choice = np.where(first >= 0, by_price[np.maximum(first, 0)], best)
        idx = np.arange(n)
        out["policy"].append(
            {
                "bar": bar,
                "quality": float(correct[held][idx, choice].mean()),
                "usd_per_1k": float(cost[held][idx, choice].mean() * 1000),
                "share_by_model": {
                    models[j]: float((choice == j).mean())
                    for j in range(len(models))
                    if (choice == j).any()
                },
            }
        )
    return out
