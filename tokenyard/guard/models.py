"""The safety layer's tables: each team's policy, and the audit log of every flag and block."""

from datetime import UTC, datetime

from sqlmodel import Field, SQLModel


def _now() -> datetime:
    return datetime.now(UTC)


class GuardPolicy(SQLModel, table=True):
    __tablename__ = "guard_policy"

    team: str = Field(primary_key=True)
    policy: str  # guard.policy.Policy as JSON
    updated_at: datetime = Field(default_factory=_now)


class GuardAudit(SQLModel, table=True):
    __tablename__ = "guard_audit"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = Field(default_factory=_now, index=True)
    request_id: str = Field(index=True)
    team: str = Field(index=True)
    direction: str  # input | output
    action: str  # flag | block
    categories: str  # comma-separated, the ones over the team's thresholds
    scores: str  # JSON: every category's score
    model: str = ""
    end_user: str | None = None  # the request's `safety_identifier` or `user`: who to look at
    text: str | None = None  # only when the team's policy opts in (store_text)
