"""Training rows as the fit sees them (router/training/train.py): no prompt text, so the
platform's rated requests (stored as embeddings, router/features.py) and benchmark prompts are
alike."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Samples:
    """One row a prompt: its embedding and length, both models' quality, its domain."""

    raw: np.ndarray  # mean MiniLM token vector (384) of each prompt
    log_chars: np.ndarray
    weak: np.ndarray
    strong: np.ndarray
    domain: np.ndarray

    def __len__(self) -> int:
        return len(self.weak)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.raw, self.log_chars, self.weak, self.strong, self.domain)

    def take(self, idx: np.ndarray) -> "Samples":
        return Samples(*(a[idx] for a in self.arrays()))

    @staticmethod
    def join(parts: Sequence["Samples"]) -> "Samples":
        return Samples(*(np.concatenate(a) for a in zip(*(p.arrays() for p in parts), strict=True)))
