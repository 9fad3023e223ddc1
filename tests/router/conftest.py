"""Shared fixtures: the shipped classifier and the held-out data it was evaluated on."""

import json
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pytest

from router.classifier import DEFAULT_ARTIFACT, ComplexityClassifier
from router.train import Data, TrainConfig, load_data


@dataclass
class Shipped:
    classifier: ComplexityClassifier
    data: Data
    report: dict

    @cached_property
    def test_scores(self) -> np.ndarray:
        """Batch scores of data.part("test"), in order (several tests share them)."""
        return self.classifier.score_many([e.prompt for e in self.data.part("test")])


@pytest.fixture(scope="session")
def shipped() -> Shipped:
    classifier = ComplexityClassifier.load(DEFAULT_ARTIFACT)
    config = classifier.metadata["config"]
    # the splits are a function of the seed and fractions the artifact was trained with
    data = load_data(
        TrainConfig(seed=config["seed"], val_frac=config["val_frac"], test_frac=config["test_frac"])
    )
    report_path = DEFAULT_ARTIFACT.with_name(DEFAULT_ARTIFACT.stem + "-report.json")
    return Shipped(classifier=classifier, data=data, report=json.loads(report_path.read_text()))
