"""Each model's predicted quality on a prompt, from the router's score alone, and the cost-aware
choice built on it: the cheapest model whose predicted quality clears a bar.

A model's curve is a one-feature logistic regression of its correctness on the logit of the
router's score. The artifact carries one curve per model of RouterBench's data (11 models), fitted
on leave-one-domain-out scores: the score of a prompt from a domain the classifier was not fitted
on, which is what the served classifier gives on real traffic. A catalog entry names the model
whose curve stands for it (`quality_reference`). Fitting is training's
(router/training/costs.py): this module is what serving needs, numpy only.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(q / (1 - q))


@dataclass(frozen=True)
class QualityCurve:
    intercept: float
    slope: float  # per unit of the score's logit; below 0: harder prompts are answered worse

    def predict(self, score: np.ndarray | float) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.intercept + self.slope * logit(score))))

    @classmethod
    def constant(cls, quality: float) -> "QualityCurve":
        """A model's mean quality whatever the prompt: the choice made without a router."""
        return cls(float(logit(quality)), 0.0)


def cheapest_clearing(predicted: Sequence[float], bar: float) -> int:
    """`predicted`: each candidate's predicted quality, cheapest first. The first that clears the
    bar; when none does, the one predicted best (the cheapest of those on a tie)."""
    for i, quality in enumerate(predicted):
        if quality >= bar:
            return i
    return int(np.argmax(predicted))
