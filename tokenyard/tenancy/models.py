"""Teams and API keys, the platform's tenancy tables (sqlmodel; the engine is core.db's).

The request path never queries SQL directly: gateway/auth.py caches what it reads here (in process,
then Redis) for well under a second, and tenancy/service.py drops the Redis entries a change
concerns, so revocations and limit changes take effect promptly.
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, UniqueConstraint
from sqlmodel import Field, SQLModel


def _now() -> datetime:
    return datetime.now(UTC)


def _count() -> Any:
    """An optional count, 64-bit in SQL: PostgreSQL's INTEGER is 32-bit, and the limits allow
    counts up to 2**53 (tenancy/limits.py)."""
    return Field(default=None, sa_type=BigInteger)


class Team(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True)
    # every limit is optional: None means unlimited
    rpm: int | None = _count()  # requests per minute
    tpm: int | None = _count()  # tokens (prompt + completion) per minute
    tokens_per_day: int | None = _count()
    usd_per_day: float | None = None  # spend is charged at settle from billing's prices
    usd_per_month: float | None = None  # the same over a calendar month (UTC)
    concurrency: int | None = _count()  # requests in flight
    kv_pages: int | None = _count()  # KV-cache pages in flight on self-hosted models
    max_tokens: int | None = _count()  # cap on a request's max_tokens
    max_context: int | None = _count()  # cap on prompt + max_tokens
    models: str = ""  # comma-separated allowed models; empty: all
    default_tier: str = "interactive"
    # model="auto": escalate prompts scoring at or above this (0-1), or, when unset, the share of
    # traffic to send to the strong model (calibrated to a score); both unset: the catalog default
    auto_threshold: float | None = None
    strong_share: float | None = None
    # model="auto": the cheapest model predicted to answer with at least this quality (0-1); set,
    # it wins over the two above
    auto_quality: float | None = None
    # seconds the gateway's response cache keeps the team's answers; 0: never; None: the platform's
    cache_ttl_s: float | None = None
    batch_tokens_per_day: int | None = _count()  # the batch tier's own daily budget
    # signs the team's webhooks, batch callbacks and budget alerts (Standard Webhooks, whsec_…;
    # tenancy/webhook_secrets.py); kept as
    # is, not hashed: signing needs the key itself, a hash could only check one
    webhook_secret: str | None = None
    alert_url: str | None = None  # the team's own receiver of its budget alerts (billing/alerts.py)
    # the team's receiver of its events (a background response or a batch ended: OpenAI's
    # webhook events, tenancy/events.py), set by the operator, or by the team with one of its keys
    webhook_url: str | None = None
    # set by the team: delivered only to public addresses or the operator's allow-list, as a batch
    # callback is; the operator's own may be any address
    webhook_url_by_team: bool = False
    # each end user's own limits within the team (None: none); a request names its end user in
    # `safety_identifier` or `user`
    user_rpm: int | None = _count()
    user_tpm: int | None = _count()
    user_usd_per_day: float | None = None
    # single models' own limits for the team: {"gpt-4o": {"rpm": 100, "tpm": 50000}} (None: none)
    model_limits: dict[str, dict[str, int]] | None = Field(default=None, sa_type=JSON)
    # the kinds of endpoint the team's keys may call (tenancy/limits.py SCOPES; None: every kind)
    scopes: str | None = None
    # the tags every deployment serving the team must carry (the catalog's; None: any deployment)
    deployment_tags: str | None = None
    # a disabled team's keys are refused (its keys, limits and usage are kept, to enable it again)
    disabled: bool = False
    created_at: datetime = Field(default_factory=_now)


class ApiKey(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    # the first characters of the key, shown in listings and used to revoke it
    prefix: str = Field(index=True, unique=True)
    key_hash: str = Field(index=True, unique=True)  # sha256 hex of the whole key
    team_id: int = Field(foreign_key="team.id", index=True)
    revoked: bool = False
    created_at: datetime = Field(default_factory=_now)
    last_used_at: datetime | None = None
    name: str | None = None  # what people call the key ("ci", "search-prod"), shown in listings
    expires_at: datetime | None = None  # refused from then on; None: until revoked
    # comma-separated models this key may use, within its team's; empty: the team's
    models: str = ""
    # the key's own limits, enforced beside its team's (None: only the team's)
    rpm: int | None = _count()
    tpm: int | None = _count()
    usd_per_day: float | None = None
    usd_per_month: float | None = None
    concurrency: int | None = _count()  # requests of this key in flight at once
    # single models' own requests and tokens per minute for this key ({"gpt-4o": {"rpm": 10}})
    model_limits: dict[str, dict[str, int]] | None = Field(default=None, sa_type=JSON)
    # the kinds of endpoint this key may call, within its team's (None: the team's)
    scopes: str | None = None


class TenancyChange(SQLModel, table=True):
    """One change to a team or a key, who made it and what it changed: the operators' audit trail.
    Written in the change's own transaction, so a change is never without its row (nor a row
    without its change); never a key's secret or hash."""

    __tablename__ = "tenancy_change"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=_now, index=True)
    # who: "admin-api:<key holder>", "admin-ui:<user>", "cli:<os user>", "system" (library calls,
    # `tokenyard up`)
    actor: str
    # team.create / team.update / team.disable / team.enable / team.delete, key.create / key.update
    # / key.revoke / key.rotate
    action: str
    team: str = Field(index=True)  # by name: the row outlives a deleted team
    key_prefix: str | None = None
    # create: the settings given; update: {field: [before, after]} of those that changed
    details: dict[str, Any] | None = Field(default=None, sa_type=JSON)


class EndUserBlock(SQLModel, table=True):
    """An end user a team has blocked (LiteLLM's blocked customers): its requests are refused, by
    the name the client gives it (`safety_identifier` or `user`)."""

    __tablename__ = "end_user_block"
    __table_args__ = (UniqueConstraint("team", "end_user"),)

    id: int | None = Field(default=None, primary_key=True)
    team: str = Field(index=True)
    end_user: str
    reason: str | None = None  # what the team noted (an audit row's request id, a ticket)
    created_at: datetime = Field(default_factory=_now)


class TeamEvent(SQLModel, table=True):
    """One of a team's events (OpenAI's webhook events: `response.completed`, `batch.failed`, …),
    recorded where its team has a `webhook_url`, then sent there at least once (core/outbox.py)."""

    __tablename__ = "team_event"

    id: str = Field(primary_key=True)  # evt_…: the webhook-id of every try
    team: str = Field(index=True)
    type: str
    data: dict[str, Any] = Field(sa_type=JSON)  # {"id": <the response's or the batch's id>}
    created_at: datetime = Field(default_factory=_now, index=True)
    delivered_at: datetime | None = None
    claims: int = 0
    retry_at: datetime | None = None  # the current claim's end, or the next try after a failure
    last_error: str | None = None
