"""Billing's SQL tables (sqlmodel): one UsageRecord per request, the daily rollups kept from them,
teams' ratings of requests, and budget alerts. Costs are US dollars; times are seconds."""

from datetime import date, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


def _sum() -> Any:
    """A rollup's count, 64-bit in SQL: PostgreSQL's INTEGER is 32-bit, and a busy team's tokens of
    one day pass 2**31."""
    return Field(default=0, sa_type=BigInteger)


class UsageRecord(SQLModel, table=True):
    __tablename__ = "usage_record"
    __table_args__ = (
        # a team's records of a range of days, grouped by end user (reports.by_end_user)
        Index("ix_usage_record_team_day_end_user", "team", "day", "end_user"),
        # a team's newest records first (request_log.recent)
        Index("ix_usage_record_team_id", "team", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    # the gateway's own id, never the client's: the idempotency key (a re-delivered event is
    # skipped), so a client can neither reuse one to go unbilled nor suppress another's records
    request_id: str = Field(unique=True)
    # the client's own id for the request (X-Client-Request-Id), checked and bounded; not unique
    client_request_id: str | None = Field(default=None, index=True)
    day: date = Field(index=True)  # UTC date the request started: its rollup row
    team: str = Field(index=True)
    key_prefix: str = ""  # which of the team's keys (never the key itself)
    # the team's own end user (the request's `safety_identifier` or `user`), bounded
    end_user: str | None = None
    # the request's `metadata` (up to 16 string pairs: the team's labels, e.g. feature or project),
    # reported by any of its keys (reports.by_metadata); `metadata` itself is SQLModel's attribute
    request_metadata: dict[str, str] | None = Field(default=None, sa_type=JSON)
    model: str  # as asked ("auto" included)
    model_served: str  # what answered, after routing and fallbacks
    provider: str = ""
    tier: str = ""
    stream: bool = False
    status: int  # the HTTP status the client got
    finish_reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # part of prompt_tokens (OpenAI's convention)
    # part of prompt_tokens too: written to the provider's prompt cache (Anthropic's premium)
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    # what an audio model was priced by: seconds transcribed, characters spoken
    audio_seconds: float = 0.0
    characters: int = 0
    usage_reported: bool = False  # False: the gateway's estimate (the upstream reported none)
    # what the team is charged: engine time × $/hour for self-hosted models, list price otherwise
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0  # the catalog's per-token price, for comparison
    ttft_s: float | None = None
    latency_s: float = 0.0  # as the gateway saw it
    queue_s: float | None = None  # engine queue (self-hosted)
    compute_s: float | None = None  # the request's share of engine step time (self-hosted)
    started_at: datetime
    finished_at: datetime
    # model="auto" only: the router's view of the prompt (router/feedback.py), never its text
    route_features: str | None = None
    cache_hit: bool = False  # answered from the gateway's response cache: nothing upstream, no cost


class RouteFeedback(SQLModel, table=True):
    """A team's rating of one of its own requests (`POST /v1/feedback`): the router's training
    signal from the platform's traffic. One per request; a second rating replaces the first."""

    __tablename__ = "route_feedback"

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(unique=True)  # the gateway's, as in usage_record
    team: str = Field(index=True)
    score: float  # 0 (useless) .. 1 (fully satisfying)
    comment: str | None = None
    created_at: datetime


class BudgetAlert(SQLModel, table=True):
    """A dollar budget's percent crossed (`TOKENYARD_BUDGET_ALERT_AT`): one per budget, period and
    percent, recorded with the usage event whose charge crossed it (the quota script finds the
    crossing), then sent to the operator's webhook, at least once."""

    __tablename__ = "budget_alert"
    __table_args__ = (UniqueConstraint("team", "key_prefix", "budget", "period", "percent"),)

    id: int | None = Field(default=None, primary_key=True)
    team: str = Field(index=True)
    key_prefix: str = ""  # the key whose own budget it is; "" for the team's
    budget: str  # usd_per_day, usd_per_month, key_usd_per_day or key_usd_per_month
    period: str  # the day ("2026-11-27") or the month ("2026-11") it charged
    percent: int
    spent_usd: float  # the period's spend after the crossing charge
    limit_usd: float
    request_id: str  # the request whose charge crossed it
    created_at: datetime = Field(index=True)
    # delivery to TOKENYARD_ALERT_WEBHOOK_URL: claimed by one gateway at a time until delivered
    delivered_at: datetime | None = None
    claims: int = 0
    retry_at: datetime | None = None  # the current claim's end, or the next try after a failure
    last_error: str | None = None


class RollupSums(SQLModel):
    """What each rollup sums over its records."""

    requests: int = _sum()
    errors: int = _sum()  # requests answered with a status other than 200
    prompt_tokens: int = _sum()
    cached_tokens: int = _sum()
    cache_write_tokens: int = _sum()
    completion_tokens: int = _sum()
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0


class UsageDaily(RollupSums, table=True):
    """Per team, served model and UTC day; updated in the transaction that inserts records."""

    __tablename__ = "usage_daily"

    day: date = Field(primary_key=True)
    team: str = Field(primary_key=True)
    model: str = Field(primary_key=True)


class UsageKeyDaily(RollupSums, table=True):
    """Per team, API key (its prefix) and UTC day, kept like UsageDaily: what a key's pages and
    reports read, instead of scanning a month of records."""

    __tablename__ = "usage_key_daily"

    day: date = Field(primary_key=True)
    team: str = Field(primary_key=True)
    key_prefix: str = Field(primary_key=True)


# the rollups' summed columns, in the order reports show them
ROLLUP_SUMS = tuple(RollupSums.model_fields)
