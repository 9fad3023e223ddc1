"""The router's view of a prompt as stored with its usage record (`route_features`: the artifact
version, the decision, the prompt's projected embedding and length; never its text), and the
training rows that teams' ratings of such requests become.

Ratings of requests the router sent to the weak class become rows whose weak quality is the score
and strong quality 1 (a request the strong class served says nothing of what the weak one would
have done, so those are not used). The embedding is mapped back to MiniLM's space through the
serving artifact's axes; rows from another artifact version are skipped.
"""

import base64
import math
from typing import Any

import numpy as np

from router.classifier import ComplexityClassifier

FEEDBACK_DOMAIN = "feedback"


def encode_features(version: str, decision: str, projected: np.ndarray, chars: int) -> str:
    """`version:decision:base64(float16 [projected…, log(1 + chars)])`, ~100 bytes."""
    values = np.append(projected, math.log1p(chars)).astype("<f2")
    return f"{version}:{decision}:{base64.b64encode(values.tobytes()).decode()}"


def decode_features(text: str) -> tuple[str, str, np.ndarray, float]:
    version, decision, data = text.split(":", 2)
    values = np.frombuffer(base64.b64decode(data), dtype="<f2").astype(np.float64)
    return version, decision, values[:-1], float(values[-1])


def feedback_samples(
    rows: list[tuple[str, float]], classifier: ComplexityClassifier | None = None
) -> Any:
    """The rated weak-class requests served by the current artifact, from (route_features,
    score) rows, as training rows."""
    from router.train import Samples

    classifier = classifier or ComplexityClassifier.load()
    scorer = classifier.scorer
    raw, log_chars, weak = [], [], []
    for features, score in rows:
        version, decision, projected, length = decode_features(features)
        if version != classifier.version or decision != "weak":
            continue
        # centred projected vector → MiniLM's space (the part off the axes is lost)
        raw.append(scorer.raw_mean + projected @ scorer.axes)
        log_chars.append(length)
        weak.append(score)
    n = len(weak)
    return Samples(
        raw=np.array(raw).reshape(n, len(scorer.raw_mean)),
        log_chars=np.array(log_chars),
        weak=np.array(weak),
        strong=np.ones(n),
        domain=np.full(n, FEEDBACK_DOMAIN),
    )
