"""The complexity classifier as shipped: the artifact (router/artifacts/complexity-vN.joblib, the
scorer's arrays) with its metadata (version, the threshold curve for a share of strong traffic,
each reference model's quality curve).
How a prompt is scored is router/scorer.py."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tokenyard.core.artifacts import load_artifact
from tokenyard.router.quality import QualityCurve
from tokenyard.router.scorer import CompiledScorer, RouteScore

DEFAULT_ARTIFACT = Path(__file__).parent / "artifacts" / "complexity-v7.joblib"


@dataclass(frozen=True)
class ComplexityClassifier:
    scorer: CompiledScorer
    metadata: dict[str, Any]
    quality_curves: dict[str, QualityCurve] = field(init=False)

    def __post_init__(self) -> None:
        curves = self.metadata.get("quality_curves", {})  # none in artifacts before them
        object.__setattr__(
            self, "quality_curves", {m: QualityCurve(**c) for m, c in curves.items()}
        )

    @classmethod
    def load(cls, path: Path | str = DEFAULT_ARTIFACT) -> "ComplexityClassifier":
        scorer, metadata = load_artifact(path, "tokenyard router train")
        return cls(scorer=scorer, metadata=metadata)

    @property
    def version(self) -> str:
        return str(self.metadata["version"])

    def score(self, prompt: str) -> float:
        return self.scorer.route_score(prompt).score

    def route_score(self, prompt: str) -> RouteScore:
        return self.scorer.route_score(prompt)

    def threshold_for_strong_share(self, share: float) -> float:
        """The threshold that sends about `share` (0..1) of traffic to the strong model."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"strong share must be in [0, 1], got {share}")
        curve = self.metadata["threshold_curve"]
        return float(np.interp(share, curve["strong_share"], curve["threshold"]))
