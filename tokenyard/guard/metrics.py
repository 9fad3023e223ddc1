"""The safety layer's Prometheus series (in core.metrics' registry; team-labelled series are shown
to the metrics key's bearer only)."""

from prometheus_client import Counter, Histogram

from tokenyard.core.metrics import REGISTRY

OUTCOMES = Counter(
    "tokenyard_guard_outcomes_total",
    "Safety checks by team, category (none: nothing over a threshold), direction and action "
    "(allow, flag, block)",
    ["team", "category", "direction", "action"],
    registry=REGISTRY,
)
CHECK_SECONDS = Histogram(
    "tokenyard_guard_check_seconds",
    "Time to score one text (input: the prompt; output: one window of the reply)",
    ["direction"],
    buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0),
    registry=REGISTRY,
)
AUDIT_DROPPED = Counter(
    "tokenyard_guard_audit_dropped_total",
    "Audit rows not written (queue full or SQL down)",
    registry=REGISTRY,
)
