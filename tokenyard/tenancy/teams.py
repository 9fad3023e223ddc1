"""Teams in SQL: create, read, change limits, disable and enable, delete.

Operations that change what a team's keys may do return those keys' hashes: the gateways cache key
lookups, and the caller (tenancy/service.py) drops them so the change applies at once. Each change
is recorded, with who made it (`actor`), in the same transaction (tenancy/changes.py).
"""

import re
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from tokenyard.tenancy.changes import SYSTEM, TEAM_FIELDS, changed, given, record, snapshot
from tokenyard.tenancy.errors import AlreadyExists, ManagementError, OperatorsChoice
from tokenyard.tenancy.keys import active_key_hashes
from tokenyard.tenancy.limits import LIMIT_FIELDS, URL_FIELDS, problem, scopes_text, tags_text
from tokenyard.tenancy.lookups import find_blocks, find_team
from tokenyard.tenancy.models import ApiKey, Team

# team names appear in Redis keys and metrics labels: keep them plain
# a first letter or digit: "." and ".." would otherwise be names, and break /admin/teams/{name}
TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TEAM_NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"


def _apply(team: Team, limits: dict[str, Any]) -> None:
    for name, value in limits.items():
        if name not in LIMIT_FIELDS:
            raise ValueError(f"unknown team field {name!r}")
        if (error := problem(name, value)) is not None:
            raise ValueError(f"{name} {error}")
        if name == "models" and not isinstance(value, str):
            value = ",".join(value)
        if name == "scopes":
            value = scopes_text(value)
        if name == "deployment_tags":
            value = tags_text(value)
        if name in (*URL_FIELDS, "model_limits") and not value:  # '' or {} clears it
            value = None
        if name == "webhook_url" and value != team.webhook_url:
            # the operator's receiver now; the same URL again (a form saved whole) stays the
            # team's, held to the team's rule
            team.webhook_url_by_team = False
        setattr(team, name, value)


def _existing(session: Session, name: str) -> Team:
    team = find_team(session, name)
    if team is None:
        raise ManagementError(f"no team {name!r}")
    return team


def create_team(sql: Engine, name: str, *, actor: str = SYSTEM, **limits: Any) -> Team:
    if not TEAM_NAME.fullmatch(name):
        raise ValueError(f"team names are {TEAM_NAME_RULE}")
    team = Team(name=name)
    _apply(team, limits)
    with Session(sql) as session:
        session.add(team)
        record(session, actor, "team.create", name, details=given(team, TEAM_FIELDS))
        try:
            session.commit()
        except IntegrityError:
            # the name's unique index decides, so two concurrent creates cannot both pass a check
            # made before the insert
            raise AlreadyExists(f"team {name!r} already exists") from None
        session.refresh(team)
        return team


def update_team(
    sql: Engine, name: str, *, actor: str = SYSTEM, **limits: Any
) -> tuple[Team, list[str]]:
    """Change a team's limits. Returns the team and its active keys' hashes."""
    with Session(sql) as session:
        team = _existing(session, name)
        before = snapshot(team, TEAM_FIELDS)
        _apply(team, limits)
        session.add(team)
        if difference := changed(before, snapshot(team, TEAM_FIELDS)):
            record(session, actor, "team.update", name, details=difference)
        session.commit()
        session.refresh(team)
    return team, active_key_hashes(sql, name)


def set_disabled(
    sql: Engine, name: str, disabled: bool, *, actor: str = SYSTEM
) -> tuple[Team, list[str]]:
    """Disable (or enable) a team: its keys are refused while it is disabled. Returns the team
    and its active keys' hashes."""
    with Session(sql) as session:
        team = _existing(session, name)
        if team.disabled != disabled:
            record(session, actor, "team.disable" if disabled else "team.enable", name)
        team.disabled = disabled
        session.add(team)
        session.commit()
        session.refresh(team)
    return team, active_key_hashes(sql, name)


def set_own_webhook(sql: Engine, name: str, url: str | None, *, actor: str) -> Team:
    """The team's own receiver of its events, set (None: cleared) with one of its keys; never in
    place of one the operator set (OperatorsChoice). The URL is checked by the caller."""
    with Session(sql) as session:
        team = _existing(session, name)
        if team.webhook_url is not None and not team.webhook_url_by_team:
            raise OperatorsChoice("the operator set this team's webhook_url: ask them to change it")
        before = snapshot(team, ("webhook_url",))
        team.webhook_url, team.webhook_url_by_team = url, url is not None
        if difference := changed(before, snapshot(team, ("webhook_url",))):
            record(session, actor, "team.webhook", name, details=difference)
        session.add(team)
        session.commit()
        session.refresh(team)
    return team


def delete_team(sql: Engine, name: str, *, actor: str = SYSTEM) -> list[str]:
    """Delete a team and its keys (so they stop working); its usage records stay, under its name,
    and so does its trail of changes. Returns the deleted keys' hashes."""
    with Session(sql) as session:
        team = _existing(session, name)
        keys = list(session.exec(select(ApiKey).where(ApiKey.team_id == team.id)))
        hashes = [k.key_hash for k in keys if not k.revoked]
        record(session, actor, "team.delete", name, details={"keys": [k.prefix for k in keys]})
        for block in find_blocks(session, name):  # a later team of the same name starts afresh
            session.delete(block)
        for key in keys:
            session.delete(key)
        session.delete(team)
        session.commit()
        return hashes


def get_team(sql: Engine, name: str) -> Team | None:
    with Session(sql) as session:
        return find_team(session, name)


def list_teams(sql: Engine) -> list[Team]:
    with Session(sql) as session:
        return list(session.exec(select(Team).order_by(Team.name)))


def team_record(team: Team) -> dict[str, Any]:
    """A team as the CLI and the admin API show it: its name, state and limits (None: unlimited);
    never its webhook secret."""
    limits = {name: getattr(team, name) for name in LIMIT_FIELDS}
    return {
        "name": team.name,
        **limits,
        "disabled": team.disabled,
        "created_at": team.created_at.isoformat(),
    }
