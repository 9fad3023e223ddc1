"""The router's view of a prompt as stored with its usage record (`route_features`: the artifact
version, the decision, the prompt's projected embedding, length and share of code lines; never
its text), and what
teams' ratings of such requests become: training rows (each served model's quality curve is fitted
from them in router/training/costs.py, `own_curves`).

Ratings of requests the router sent to the weak class become rows whose weak quality is the score
and strong quality 1 (a request the strong class served says nothing of what the weak one would
have done, so those are not used). The embedding is mapped back to MiniLM's space through the
serving artifact's axes; rows from another artifact version are skipped.

Serving imports this module (`encode_features`); the fitting stays in training code.
"""

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.router.samples import Samples

FEEDBACK_DOMAIN = "feedback"


def encode_features(
    version: str, decision: str, projected: np.ndarray, chars: int, code: float
) -> str:
    """`version:decision:base64(float16 [projected…, log(1 + chars), code share])`, ~100 bytes."""
    values = np.append(projected, [math.log1p(chars), code]).astype("<f2")
    return f"{version}:{decision}:{base64.b64encode(values.tobytes()).decode()}"


def decode_features(text: str) -> tuple[str, str, np.ndarray, float, float]:
    """(version, decision, projected, log(1 + chars), code share); a row of another artifact
    version may have another layout (before v7, no code share), and `ratings` skips it."""
    version, decision, data = text.split(":", 2)
    values = np.frombuffer(base64.b64decode(data), dtype="<f2").astype(np.float64)
    return version, decision, values[:-2], float(values[-2]), float(values[-1])


@dataclass(frozen=True)
class Ratings:
    """The rated requests the current artifact routed, each as the fit sees a prompt (its mean
    MiniLM token vector, mapped back through the serving artifact's axes: the part off the axes
    is lost), with the router's decision, the model that served it and the rating."""

    raw: np.ndarray
    log_chars: np.ndarray
    code: np.ndarray
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


def ratings(
    rows: Sequence[tuple[str, str, float]], classifier: ComplexityClassifier | None = None
) -> Ratings:
    """(route_features, model served, rating) rows (billing.feedback.feedback_rows) of the
    current artifact's version; others are skipped."""
    classifier = classifier or ComplexityClassifier.load()
    scorer = classifier.scorer
    kept = []
    for features, model, rating in rows:
        version, decision, projected, log_chars, code = decode_features(features)
        if version == classifier.version:
            raw = scorer.raw_mean + projected @ scorer.axes
            kept.append((raw, log_chars, code, decision, model, rating))
    columns = list(zip(*kept, strict=True)) if kept else [[]] * 6
    return Ratings(
        raw=np.array(columns[0]).reshape(len(kept), len(scorer.raw_mean)),
        log_chars=np.array(columns[1], dtype=float),
        code=np.array(columns[2], dtype=float),
        decision=np.array(columns[3], dtype=str),
        model=np.array(columns[4], dtype=str),
        rating=np.array(columns[5], dtype=float),
    )
