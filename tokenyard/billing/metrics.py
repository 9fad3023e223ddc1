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

BUDGET_ALERTS = Counter(
    "tokenyard_billing_budget_alerts_total",
    "Budget alerts recorded (a percent of a dollar budget crossed), by budget",
    ["budget"],
    registry=REGISTRY,
)

ALERT_DELIVERIES = Counter(
    "tokenyard_billing_alert_deliveries_total",
    "Budget alert webhook deliveries, by outcome (delivered, failed: retried later)",
    ["outcome"],
    registry=REGISTRY,
)
