"""Billing's SQL tables (sqlmodel): one UsageRecord per request, and the daily rollups kept from
them. Costs are US dollars; times are seconds."""

from datetime import date, datetime

from sqlmodel import Field, SQLModel


class UsageRecord(SQLModel, table=True):
    __tablename__ = "usage_record"

    id: int | None = Field(default=None, primary_key=True)
    # the gateway's own id, never the client's: the idempotency key (a re-delivered event is
    # skipped), so a client can neither reuse one to go unbilled nor suppress another's records
    request_id: str = Field(unique=True)
    # the client's own id for the request (X-Client-Request-Id), checked and bounded; not unique
    client_request_id: str | None = Field(default=None, index=True)
    day: date = Field(index=True)  # UTC date the request started: its rollup row
    team: str = Field(index=True)
    key_prefix: str = ""  # which of the team's keys (never the key itself)
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
    completion_tokens: int = 0
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


class UsageDaily(SQLModel, table=True):
    """Per team, served model and UTC day; updated in the transaction that inserts records."""

    __tablename__ = "usage_daily"

    day: date = Field(primary_key=True)
    team: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    requests: int = 0
    errors: int = 0  # requests answered with a status other than 200
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0


# the rollup's summed columns, in the order reports show them
ROLLUP_SUMS = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_usd",
    "list_cost_usd",
)
