"""A team by its name, a key by its prefix and a team's blocked end users, as every tenancy
operation finds them. A name or
prefix holding NUL finds nothing without a query: PostgreSQL's text cannot compare it (the query
would fail, a 500), and no stored row holds one."""

from sqlmodel import Session, col, select

from tokenyard.core.db import matchable
from tokenyard.tenancy.models import ApiKey, EndUserBlock, Team


def find_team(session: Session, name: str) -> Team | None:
    if not matchable(name):
        return None
    return session.exec(select(Team).where(Team.name == name)).first()


def find_key(session: Session, prefix: str) -> ApiKey | None:
    if not matchable(prefix):
        return None
    return session.exec(select(ApiKey).where(ApiKey.prefix == prefix)).first()


def find_blocks(session: Session, team: str) -> list[EndUserBlock]:
    """The team's blocked end users, oldest first."""
    if not matchable(team):
        return []
    query = select(EndUserBlock).where(EndUserBlock.team == team)
    return list(session.exec(query.order_by(col(EndUserBlock.created_at))))
