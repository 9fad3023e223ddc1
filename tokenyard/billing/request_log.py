"""Each request's own record, newest first: what a team reads to see what became of one request
(by the gateway's id or its own) or of its recent traffic, filtered by model, key, end user or
errors only; never another team's. Paged by the record's id (`before`), so new requests arriving
while a client pages do not shift the pages."""

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, or_
from sqlmodel import Session, col, select

from tokenyard.billing.models import UsageRecord
from tokenyard.core.db import matchable

# what a request's entry shows: its ids, who and what, how it ended, its usage, cost and timings
FIELDS = (
    "request_id",
    "client_request_id",
    "team",
    "key_prefix",
    "end_user",
    "model",
    "model_served",
    "tier",
    "stream",
    "status",
    "finish_reason",
    "error",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "completion_tokens",
    "audio_seconds",
    "characters",
    "cost_usd",
    "ttft_s",
    "latency_s",
    "cache_hit",
)


@dataclass(frozen=True)
class Filters:
    model: str | None = None  # as asked ("auto" included) or as served
    key_prefix: str | None = None
    end_user: str | None = None
    request_id: str | None = None  # the gateway's id, or the client's own
    errors: bool = False  # only requests that did not end with a 200


def _entry(record: UsageRecord) -> dict[str, Any]:
    entry = {name: getattr(record, name) for name in FIELDS}
    entry["id"] = record.id  # the paging cursor
    entry["metadata"] = record.request_metadata
    entry["started_at"] = record.started_at.isoformat()
    return entry


def recent(
    engine: Engine, team: str | None, filters: Filters, limit: int, before: int | None = None
) -> list[dict[str, Any]]:
    """At most `limit` records of one team (None: every team's) matching the filters, newest
    first, older than the record `before` where given."""
    if not matchable(team, filters.model, filters.key_prefix, filters.end_user, filters.request_id):
        return []
    query = select(UsageRecord)
    if team is not None:
        query = query.where(UsageRecord.team == team)
    if before is not None:
        query = query.where(col(UsageRecord.id) < before)
    if filters.model is not None:
        query = query.where(
            or_(UsageRecord.model == filters.model, UsageRecord.model_served == filters.model)
        )
    if filters.key_prefix is not None:
        query = query.where(UsageRecord.key_prefix == filters.key_prefix)
    if filters.end_user is not None:
        query = query.where(UsageRecord.end_user == filters.end_user)
    if filters.request_id is not None:
        rid = filters.request_id
        query = query.where(
            or_(UsageRecord.request_id == rid, UsageRecord.client_request_id == rid)
        )
    if filters.errors:
        query = query.where(UsageRecord.status != 200)
    query = query.order_by(col(UsageRecord.id).desc()).limit(limit)
    with Session(engine) as session:
        return [_entry(record) for record in session.exec(query)]
