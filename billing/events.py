"""The usage event the gateway appends to the Redis stream when a request settles, and the
UsageRecord row it becomes."""

from datetime import UTC, datetime
from typing import Any

import msgspec

from gateway.keys import KEY_PREFIX_LEN


class UsageEvent(msgspec.Struct):
    """What gateway/proxy.py puts in the event; fields the gateway may not know default."""

    request_id: str
    team: str
    model: str
    model_served: str
    ts: float  # when the request started (unix seconds)
    client_request_id: str | None = None
    status: int = 0
    key_prefix: str = ""
    provider: str = ""
    tier: str = ""
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    usage_reported: bool = False
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0
    e2e: float = 0.0
    timings: dict[str, Any] | None = None  # the engine's: queue, ttft, compute (self-hosted)
    ttft: float | None = None  # the gateway's own first-byte time, where it measured one
    finish_reason: str | None = None
    error: str | None = None
    route_features: str | None = None  # model="auto": the router's view of the prompt


decoder = msgspec.json.Decoder(UsageEvent)


def key_prefix(authorization: str | None) -> str:
    """The visible prefix of the bearer key (as stored in ApiKey.prefix), never the secret."""
    token = (authorization or "").removeprefix("Bearer ").strip()
    return token[:KEY_PREFIX_LEN]


def _finish_reason(event: UsageEvent) -> str | None:
    if event.finish_reason or event.status == 200:
        return event.finish_reason
    return "cancelled" if event.status == 499 else "error"


def _seconds(timings: dict[str, Any], name: str) -> float | None:
    value = timings.get(name)
    return float(value) if isinstance(value, int | float) else None


def to_row(event: UsageEvent) -> dict[str, Any]:
    """The UsageRecord columns of one event."""
    started = datetime.fromtimestamp(event.ts, UTC)
    timings = event.timings or {}
    return {
        "request_id": event.request_id,
        "client_request_id": event.client_request_id,
        "day": started.date(),
        "team": event.team,
        "key_prefix": event.key_prefix,
        "model": event.model,
        "model_served": event.model_served,
        "provider": event.provider,
        "tier": event.tier,
        "stream": event.stream,
        "status": event.status,
        "finish_reason": _finish_reason(event),
        "error": event.error,
        "prompt_tokens": event.prompt_tokens,
        "cached_tokens": event.cached_tokens,
        "completion_tokens": event.completion_tokens,
        "usage_reported": event.usage_reported,
        "cost_usd": event.cost_usd,
        "list_cost_usd": event.list_cost_usd,
        "ttft_s": event.ttft if event.ttft is not None else _seconds(timings, "ttft"),
        "latency_s": event.e2e,
        "queue_s": _seconds(timings, "queue"),
        "compute_s": _seconds(timings, "compute"),
        "started_at": started,
        "finished_at": datetime.fromtimestamp(event.ts + event.e2e, UTC),
        "route_features": event.route_features,
    }
