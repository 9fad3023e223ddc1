"""The router's view of a prompt as stored with its usage record (`route_features`: the artifact
version, the decision, the prompt's projected embedding and length; never its text), and what
teams' ratings of such requests become: training rows, and each served model's quality curve.

Ratings of requests the router sent to the weak class become rows whose weak quality is the score
and strong quality 1 (a request the strong class served says nothing of what the weak one would
have done, so those are not used). The embedding is mapped back to MiniLM's space through the
serving artifact's axes; rows from another artifact version are skipped.

Every rated request also says how well the model that served it did at its score: a model with
at least MIN_CURVE_ROWS ratings gets its own quality curve, keyed by its catalog id, which the
cost-aware choice prefers to its `quality_reference` (router/quality.py). Auto sent each model the
scores its class gets, so such a curve is measured over that range and extrapolated beyond it.
"""

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from router.classifier import ComplexityClassifier
from router.quality import QualityCurve
from router.samples import Samples
from router.scorer import CompiledScorer

FEEDBACK_DOMAIN = "feedback"
MIN_CURVE_ROWS = 100  # ratings of one model before its own curve replaces the reference's


def encode_features(version: str, decision: str, projected: np.ndarray, chars: int) -> str:
    """`version:decision:base64(float16 [projected…, log(1 + chars)])`, ~100 bytes."""
    values = np.append(projected, math.log1p(chars)).astype("<f2")
    return f"{version}:{decision}:{base64.b64encode(values.tobytes()).decode()}"


def decode_features(text: str) -> tuple[str, str, np.ndarray, float]:
    version, decision, data = text.split(":", 2)
    values = np.frombuffer(base64.b64decode(data), dtype="<f2").astype(np.float64)
    return version, decision, values[:-1], float(values[-1])


@dataclass(frozen=True)
class Ratings:
    """The rated requests the current artifact routed, each as the fit sees a prompt (its mean
    MiniLM token vector, mapped back through the serving artifact's axes: the part off the axes
    is lost), with the router's decision, the model that served it and the rating."""

    raw: np.ndarray
    log_chars: np.ndarray
    decision: np.ndarray
    model: np.ndarray
    rating: np.ndarray

    def __len__(self) -> int:
        return len(self.rating)

    def samples(self) -> Samples:
        """The weak-class ratings as training rows: weak quality the rating, strong 1."""
        weak = self.decision == "weak"
        n = int(weak.sum())
        return Samples(
            raw=self.raw[weak],
            log_chars=self.log_chars[weak],
            weak=self.rating[weak],
            strong=np.ones(n),
            domain=np.full(n, FEEDBACK_DOMAIN),
        )

    def curves(
        self, scorer: CompiledScorer, min_rows: int = MIN_CURVE_ROWS
    ) -> dict[str, QualityCurve]:
        """Each model rated at least `min_rows` times: its ratings against `scorer`'s score (the
        artifact that will serve the curves)."""
        from router.costs import fit_curve

        scores = np.array(
            [scorer.score_raw(r, c) for r, c in zip(self.raw, self.log_chars, strict=True)]
        )
        return {
            str(m): fit_curve(scores[self.model == m], self.rating[self.model == m])
            for m in np.unique(self.model)
            if (self.model == m).sum() >= min_rows
        }


def ratings(
    rows: Sequence[tuple[str, str, float]], classifier: ComplexityClassifier | None = None
) -> Ratings:
    """(route_features, model served, rating) rows (billing.feedback.feedback_rows) of the
    current artifact's version; others are skipped."""
    classifier = classifier or ComplexityClassifier.load()
    scorer = classifier.scorer
    kept = []
    for features, model, rating in rows:
        version, decision, projected, log_chars = decode_features(features)
        if version == classifier.version:
            kept.append(
                (scorer.raw_mean + projected @ scorer.axes, log_chars, decision, model, rating)
            )
    columns = list(zip(*kept, strict=True)) if kept else [[]] * 5
    return Ratings(
        raw=np.array(columns[0]).reshape(len(kept), len(scorer.raw_mean)),
        log_chars=np.array(columns[1], dtype=float),
        decision=np.array(columns[2], dtype=str),
        model=np.array(columns[3], dtype=str),
        rating=np.array(columns[4], dtype=float),
    )
