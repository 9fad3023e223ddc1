"""Shared fixtures: the shipped classifier, texts it flags and clears (picked from the training data
at run time, so no offensive text sits in this repository's tests), and real gateways as
tests/gateway starts them."""

from dataclasses import dataclass

import pytest

# real gateways for the end-to-end tests, as tests/gateway starts them
from tests.gateway.conftest import (  # noqa: F401
    base_env,
    data_dir,
    gateway,
    redis_server,
    sql,
    start_gateway,
    team,
    upstream,
)
from tokenyard.guard.classifier import DEFAULT_ARTIFACT, SafetyClassifier
from tokenyard.guard.taxonomy import CATEGORIES, HARMFUL
from tokenyard.guard.training.dataset import load

BENIGN = "What is the capital of France, and how many people live there?"


@dataclass
class Texts:
    harmful: str  # a prompt every default threshold puts over at least one category
    harmful_categories: list[str]
    echoed: str  # a prompt whose words, repeated as a reply (#echo), are flagged too
    benign: str = BENIGN


def over(clf: SafetyClassifier, text: str) -> list[str]:
    """The categories the gateway would flag (guard/service.py decide: gated by the harmful
    head)."""
    thresholds = clf.thresholds()
    scores = clf.scores(text)
    if HARMFUL in scores and scores[HARMFUL] < thresholds[HARMFUL]:
        return []
    return [c for c in CATEGORIES if scores[c] >= thresholds[c]]


@pytest.fixture(scope="session")
def classifier() -> SafetyClassifier:
    return SafetyClassifier.load(DEFAULT_ARTIFACT)


@pytest.fixture(scope="session")
def texts(classifier: SafetyClassifier) -> Texts:
    rows = [r for r in load() if r.source in ("advbench", "simplesafetytests") and r.harmful]
    harmful = next(r.text for r in rows if len(r.text) < 200 and over(classifier, r.text))
    echoed = next(
        r.text for r in rows if len(r.text) < 120 and over(classifier, " ".join([r.text] * 8))
    )
    assert not over(classifier, BENIGN)
    return Texts(harmful, over(classifier, harmful), echoed)
