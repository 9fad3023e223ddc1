"""The operators' audit trail: each change to a team or a key becomes a TenancyChange row, added to
the change's own session so both commit together; and reading the trail back."""

from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, SQLModel, col, select

from tokenyard.core.db import matchable
from tokenyard.tenancy.limits import KEY_LIMIT_FIELDS, LIMIT_FIELDS
from tokenyard.tenancy.models import TenancyChange

# who made a change when the caller names no one: library calls, `tokenyard up`'s demo team
SYSTEM = "system"
TEAM_FIELDS = (*LIMIT_FIELDS, "disabled")  # never webhook_secret
KEY_FIELDS = ("name", "expires_at", "models", "revoked", *KEY_LIMIT_FIELDS)
MAX_LISTED = 1000


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def snapshot(row: SQLModel, fields: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a team or key row, as JSON keeps them."""
    return {name: _plain(getattr(row, name)) for name in fields}


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """{field: [before, after]} of the fields that differ."""
    return {name: [before[name], value] for name, value in after.items() if before[name] != value}


def given(row: SQLModel, fields: tuple[str, ...]) -> dict[str, Any]:
    """A new row's settings that were set (not None, "" or False; 0 is a setting): what its
    creation asked for."""
    values = snapshot(row, fields).items()
    return {name: v for name, v in values if v is not None and v != "" and v is not False}


def record(
    session: Session,
    actor: str,
    action: str,
    team: str,
    key_prefix: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    session.add(
        TenancyChange(
            actor=actor, action=action, team=team, key_prefix=key_prefix, details=details or None
        )
    )


def list_changes(
    sql: Engine, team: str | None = None, limit: int = 100, before: int | None = None
) -> list[TenancyChange]:
    """The newest changes first, of one team or all, at most `limit`, older than the change with
    id `before` where given (the next page)."""
    if not matchable(team):
        return []
    query = select(TenancyChange)
    if team is not None:
        query = query.where(TenancyChange.team == team)
    if before is not None:
        query = query.where(col(TenancyChange.id) < before)
    query = query.order_by(col(TenancyChange.id).desc()).limit(min(limit, MAX_LISTED))
    with Session(sql) as session:
        return list(session.exec(query))


def change_record(change: TenancyChange) -> dict[str, Any]:
    """A change as the admin API and the CLI show it."""
    return {
        "id": change.id,
        "at": change.at.isoformat(),
        "actor": change.actor,
        "action": change.action,
        "team": change.team,
        "key_prefix": change.key_prefix,
        "details": change.details,
    }
