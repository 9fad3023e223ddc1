"""The UsageRecord row a usage event (core.usage.UsageEvent) becomes, and the BudgetAlert rows of
the budgets its charge crossed."""

from datetime import UTC, datetime
from typing import Any

import msgspec

from tokenyard.core.usage import UsageEvent

decoder = msgspec.json.Decoder(UsageEvent)


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
        "end_user": event.end_user,
        "request_metadata": event.metadata,
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
        "cache_write_tokens": event.cache_write_tokens,
        "completion_tokens": event.completion_tokens,
        "audio_seconds": event.audio_seconds,
        "characters": event.characters,
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
        "cache_hit": event.cache_hit,
    }


class _Crossed(msgspec.Struct):
    """One budget percent the quota script found crossed (gateway/quotas.lua, settle)."""

    budget: str
    period: str
    percent: int
    spent: int  # micro-dollars
    limit: int


_crossings = msgspec.json.Decoder(list[_Crossed])


def alert_rows(raw: bytes | None, event: UsageEvent) -> list[dict[str, Any]]:
    """The BudgetAlert columns of the crossings that rode with an event (none: no field)."""
    if not raw:
        return []
    created = datetime.fromtimestamp(event.ts + event.e2e, UTC)
    return [
        {
            "team": event.team,
            "key_prefix": event.key_prefix if c.budget.startswith("key_") else "",
            "budget": c.budget,
            "period": c.period,
            "percent": c.percent,
            "spent_usd": c.spent / 1_000_000,
            "limit_usd": c.limit / 1_000_000,
            "request_id": event.request_id,
            "created_at": created,
            "claims": 0,
        }
        for c in _crossings.decode(raw)
    ]
