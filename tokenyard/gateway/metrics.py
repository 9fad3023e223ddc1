"""Prometheus metrics of the gateway (one registry per process; scrape each gateway).

Every label value is bounded by the platform's configuration (catalog models, "auto", teams,
refusal codes, statuses), never a string a client chose: an unknown model is refused before any
series is touched. Series labelled with a team are served only to the bearer of the metrics key.
"""

from prometheus_client import Counter, Gauge, Histogram

from tokenyard.core.metrics import REGISTRY

REQUESTS = Counter(
    "tokenyard_gateway_requests_total",
    "Completion requests answered, by model and HTTP status",
    ["model", "status"],
    registry=REGISTRY,
)
REFUSALS = Counter(
    "tokenyard_gateway_refusals_total",
    "Requests refused by a quota or platform limit, by the limit's code",
    ["code"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "tokenyard_gateway_tokens_total",
    "Tokens settled, by team, model and kind (prompt, completion, cached)",
    ["team", "model", "kind"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "tokenyard_gateway_in_flight",
    "Requests holding a reservation in this process",
    registry=REGISTRY,
)
LATENCY = Histogram(
    "tokenyard_gateway_request_seconds",
    "End-to-end request time as the gateway sees it",
    ["model", "stream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
TTFT = Histogram(
    "tokenyard_gateway_ttft_seconds",
    "Time to the upstream's first streamed byte",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
ROUTES = Counter(
    "tokenyard_router_decisions_total",
    "Routing decisions, by the model asked (a model or auto) and the decision (direct, weak, "
    "strong: auto escalated)",
    ["asked", "decision"],
    registry=REGISTRY,
)
ROUTE_CONFIDENCE = Histogram(
    "tokenyard_router_confidence",
    'How sure model="auto" was of its score: 1 near the classifier\'s training prompts, 0 far '
    "from them (the score is then the length rule's)",
    buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0),
    registry=REGISTRY,
)
OVERFLOWS = Counter(
    "tokenyard_router_overflows_total",
    "Candidates skipped for a request, by model and why (saturated; down: circuit open or not "
    "ready; team_model_limit: the team's own limit on the model refused it)",
    ["model", "reason"],
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "tokenyard_router_fallbacks_total",
    "Requests moved to the next model after a backend failed before its first byte",
    ["from_model", "to_model"],
    registry=REGISTRY,
)
CACHE = Counter(
    "tokenyard_gateway_cache_lookups_total",
    "Response-cache lookups of deterministic requests, by result (hit, miss)",
    ["result"],
    registry=REGISTRY,
)
