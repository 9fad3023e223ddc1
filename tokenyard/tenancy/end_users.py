"""A team's blocked end users in SQL: block, unblock, list. The request path reads them with the
team's policy (tenancy/policy.py), so each change returns the team's active key hashes for the
caller to drop their cached lookups, and is recorded in the trail (tenancy/changes.py)."""

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from tokenyard.core.db import matchable
from tokenyard.tenancy.changes import SYSTEM, record
from tokenyard.tenancy.errors import AlreadyExists, ManagementError
from tokenyard.tenancy.keys import active_key_hashes
from tokenyard.tenancy.lookups import find_blocks, find_team
from tokenyard.tenancy.models import EndUserBlock

MAX_END_USER = 128  # as the gateway keeps a request's end user (gateway/validation.py)
MAX_REASON = 500
# blocks travel with every cached lookup of the team's keys: a bound keeps those small (a list
# this long is a job for the team's own sign-in, not for the gateway)
MAX_BLOCKS = 10_000


def _checked(end_user: str, reason: str | None) -> None:
    if not end_user or len(end_user) > MAX_END_USER or not matchable(end_user):
        raise ValueError(f"an end user is 1 to {MAX_END_USER} characters, without NUL")
    if reason is not None and (len(reason) > MAX_REASON or not matchable(reason)):
        raise ValueError(f"a reason is at most {MAX_REASON} characters, without NUL")


def block_end_user(
    sql: Engine, team: str, end_user: str, reason: str | None = None, *, actor: str = SYSTEM
) -> list[str]:
    """Refuse the team's requests that name this end user. Returns the team's active key hashes."""
    _checked(end_user, reason)
    with Session(sql) as session:
        if find_team(session, team) is None:
            raise ManagementError(f"no team {team!r}")
        if len(find_blocks(session, team)) >= MAX_BLOCKS:
            raise ValueError(f"a team blocks at most {MAX_BLOCKS} end users")
        session.add(EndUserBlock(team=team, end_user=end_user, reason=reason))
        record(session, actor, "user.block", team, details={"end_user": end_user, "reason": reason})
        try:
            session.commit()
        except IntegrityError:  # the pair's unique index decides, as for team names
            raise AlreadyExists(f"end user {end_user!r} of {team!r} is blocked already") from None
    return active_key_hashes(sql, team)


def unblock_end_user(sql: Engine, team: str, end_user: str, *, actor: str = SYSTEM) -> list[str]:
    """Let the end user's requests through again. Returns the team's active key hashes."""
    with Session(sql) as session:
        found = None
        if matchable(team, end_user):
            found = session.exec(
                select(EndUserBlock).where(
                    EndUserBlock.team == team, EndUserBlock.end_user == end_user
                )
            ).first()
        if found is None:
            raise ManagementError(f"end user {end_user!r} of {team!r} is not blocked")
        session.delete(found)
        record(session, actor, "user.unblock", team, details={"end_user": end_user})
        session.commit()
    return active_key_hashes(sql, team)


def list_blocked(sql: Engine, team: str) -> list[EndUserBlock]:
    with Session(sql) as session:
        return find_blocks(session, team)


def block_record(block: EndUserBlock) -> dict[str, str | None]:
    return {
        "user": block.end_user,
        "reason": block.reason,
        "created_at": block.created_at.isoformat(),
    }
