"""Shared fixtures: the shipped classifier, the data it was evaluated on, and its report."""

import json
from dataclasses import dataclass

import pytest

# a real gateway for the feedback endpoint's tests, as tests/gateway starts them
from tests.gateway.conftest import (  # noqa: F401
    base_env,
    data_dir,
    gateway,
    redis_server,
    sql,
    team,
    upstream,
)
from tokenyard.router.classifier import DEFAULT_ARTIFACT, ComplexityClassifier
from tokenyard.router.training.dataset import Routed, load_domains


@dataclass
class Shipped:
    classifier: ComplexityClassifier
    domains: dict[str, list[Routed]]
    report: dict


@pytest.fixture(scope="session")
def shipped() -> Shipped:
    report_path = DEFAULT_ARTIFACT.with_name(DEFAULT_ARTIFACT.stem + "-report.json")
    return Shipped(
        classifier=ComplexityClassifier.load(DEFAULT_ARTIFACT),
        domains=load_domains(),
        report=json.loads(report_path.read_text()),
    )
