"""Billing's Prometheus counters, on the gateway's registry (tokens per team and model are the
gateway's tokenyard_gateway_tokens_total)."""

from prometheus_client import Counter

from tokenyard.core.metrics import REGISTRY

COST = Counter(
    "tokenyard_billing_cost_usd_total",
    "Spend settled, by team, served model and basis (charged: what the team pays; list: the "
    "catalog's per-token price)",
    ["team", "model", "basis"],
    registry=REGISTRY,
)
