"""The process's one Prometheus registry, which every package's metrics join, and /metrics' body.

Series labelled with a team are served only to the bearer of the metrics key.
"""

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from tokenyard.core.errors import GatewayError
from tokenyard.core.operator_keys import bearer_is

REGISTRY = CollectorRegistry()
TEAM_LABEL = "team"


class _WithoutTeams:
    """REGISTRY less its team-labelled samples: who uses the platform, and how much, is not for
    anonymous scrapers."""

    def collect(self) -> Iterator[Metric]:
        for family in REGISTRY.collect():
            public = Metric(family.name, family.documentation, family.type, family.unit)
            public.samples = [s for s in family.samples if TEAM_LABEL not in s.labels]
            yield public


PUBLIC = CollectorRegistry()
PUBLIC.register(_WithoutTeams())


def exposition(authorization: str | None, key: str) -> bytes:
    """/metrics' body. With a metrics key set, every series, for the bearer of that key only;
    without, open to any scraper but with no team-labelled series."""
    if not key:
        return generate_latest(PUBLIC)
    if not bearer_is(authorization, key):
        raise GatewayError(
            401, "/metrics needs the metrics key as bearer", code="invalid_metrics_key"
        )
    return generate_latest(REGISTRY)
