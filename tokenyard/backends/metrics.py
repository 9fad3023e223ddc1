"""Prometheus metrics of the backends, on the gateway's registry (served by its /metrics)."""

from prometheus_client import Counter, Gauge

from tokenyard.core.metrics import REGISTRY

BREAKER_STATE = Gauge(
    "tokenyard_backend_breaker_state",
    "Circuit breaker state as this process sees it: 0 closed, 1 half-open, 2 open",
    ["backend"],
    registry=REGISTRY,
)
BREAKER_TRANSITIONS = Counter(
    "tokenyard_backend_breaker_transitions_total",
    "Breaker state changes this process saw, by the state entered",
    ["backend", "state"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "tokenyard_backend_retries_total",
    "Upstream attempts retried before the first byte, by reason",
    ["backend", "reason"],
    registry=REGISTRY,
)
DEPLOYMENT_REQUESTS = Counter(
    "tokenyard_backend_deployment_requests_total",
    "Attempts at each deployment of a commercial model: answered (any status but 429/5xx), "
    "retried elsewhere or later, or passed over at its own rpm/tpm (full)",
    ["backend", "deployment", "outcome"],
    registry=REGISTRY,
)
