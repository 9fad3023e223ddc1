"""Routing metrics as RouteLLM defines them (routellm/evals/benchmarks.py and evaluate.py).

A router sends a prompt to the strong model when its score reaches a threshold. RouteLLM sweeps
the thresholds at the 10-quantile edges of the scores on the benchmark (11 points, from "all
strong" to "all weak"), computes quality at each, and integrates PGR over the strong share.
"""

from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

N_BINS = 10


@dataclass(frozen=True)
class RoutingCurve:
    strong_share: np.ndarray  # ascending, in [0, 1]
    quality: np.ndarray
    weak_quality: float
    strong_quality: float

    @property
    def pgr(self) -> np.ndarray:
        return (self.quality - self.weak_quality) / (self.strong_quality - self.weak_quality)


def routing_curve(
    scores: np.ndarray, weak: np.ndarray, strong: np.ndarray, n_bins: int = N_BINS
) -> RoutingCurve:
    """weak/strong: per-prompt quality of each model (correctness, or a judge score)."""
    scores = np.asarray(scores, dtype=float)
    weak = np.asarray(weak, dtype=float)
    strong = np.asarray(strong, dtype=float)
    # pd.qcut's edges are these linear-interpolated quantiles; duplicates are kept, as in RouteLLM
    thresholds = np.quantile(scores, np.linspace(0.0, 1.0, n_bins + 1))
    shares, qualities = [], []
    for i, t in enumerate(thresholds):
        # the last edge is the maximum: ">" there gives the all-weak end point
        to_strong = scores >= t if i < n_bins else scores > t
        shares.append(to_strong.mean())
        qualities.append(np.where(to_strong, strong, weak).mean())
    order = np.argsort(shares, kind="stable")
    return RoutingCurve(
        strong_share=np.asarray(shares)[order],
        quality=np.asarray(qualities)[order],
        weak_quality=float(weak.mean()),
        strong_quality=float(strong.mean()),
    )


def apgr(curve: RoutingCurve) -> float:
    """Area under PGR over the strong share, normalised by the share range it spans."""
    span = curve.strong_share[-1] - curve.strong_share[0]
    return float(np.trapezoid(curve.pgr, curve.strong_share) / span)


def cpt(curve: RoutingCurve, target_pgr: float) -> float:
    """Smallest strong share at which the piecewise-linear PGR curve reaches target_pgr.

    RouteLLM uses np.interp on the quality axis, which agrees with this when the curve is
    monotone; on a curve that dips this returns the first crossing instead of an artefact.
    """
    pgr, share = curve.pgr, curve.strong_share
    if pgr[0] >= target_pgr:
        return float(share[0])
    for i in range(1, len(pgr)):
        if pgr[i] >= target_pgr:
            frac = (target_pgr - pgr[i - 1]) / (pgr[i] - pgr[i - 1])
            return float(share[i - 1] + frac * (share[i] - share[i - 1]))
    return float(share[-1])


@dataclass(frozen=True)
class RouterMetrics:
    apgr: float
    cpt50: float
    cpt80: float
    auroc_weak_fails: float  # nan where quality is not binary (MT-Bench)


def router_metrics(scores: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> RouterMetrics:
    curve = routing_curve(scores, weak, strong)
    weak_fails = np.asarray(weak) < 0.5
    binary = np.isin(np.asarray(weak, dtype=float), (0.0, 1.0)).all()
    auroc = (
        float(roc_auc_score(weak_fails, scores))
        if binary and 0 < weak_fails.sum() < len(weak_fails)
        else float("nan")
    )
    return RouterMetrics(
        apgr=apgr(curve), cpt50=cpt(curve, 0.5), cpt80=cpt(curve, 0.8), auroc_weak_fails=auroc
    )


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


def bootstrap(
    scores_by_router: dict[str, np.ndarray],
    weak: np.ndarray,
    strong: np.ndarray,
    n_resamples: int,
    seed: int,
    baseline: str,
) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, Interval]]]:
    """95% percentile intervals per router and metric, and paired intervals of each router's
    difference to `baseline` (same resampled prompts for every router, so the difference's
    interval is much tighter than the two separate ones suggest)."""
    rng = np.random.default_rng(seed)
    n = len(weak)
    point = {k: router_metrics(s, weak, strong) for k, s in scores_by_router.items()}
    draws: dict[str, list[RouterMetrics]] = {k: [] for k in scores_by_router}
    for _ in range(n_resamples):
        idx = rng.integers(0, n, n)
        for k, s in scores_by_router.items():
            draws[k].append(router_metrics(s[idx], weak[idx], strong[idx]))
    fields = ("apgr", "cpt50", "cpt80", "auroc_weak_fails")

    def interval(value: float, samples: np.ndarray) -> Interval:
        if np.isnan(samples).all():  # AUROC on judge scores: undefined
            return Interval(value=float("nan"), low=float("nan"), high=float("nan"))
        lo, hi = np.nanpercentile(samples, [2.5, 97.5])
        return Interval(value=value, low=float(lo), high=float(hi))

    def samples(ds: list[RouterMetrics], f: str) -> np.ndarray:
        return np.array([getattr(d, f) for d in ds])

    absolute = {
        k: {f: interval(getattr(point[k], f), samples(ds, f)) for f in fields}
        for k, ds in draws.items()
    }
    paired = {
        k: {
            f: interval(
                getattr(point[k], f) - getattr(point[baseline], f),
                samples(ds, f) - samples(draws[baseline], f),
            )
            for f in fields
        }
        for k, ds in draws.items()
        if k != baseline
    }
    return absolute, paired
