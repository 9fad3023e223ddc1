"""API keys: their form, how a request's key is found and checked, and their management in SQL.

A key is `ty-` + 32 random url-safe bytes. Only its sha256 is stored, with a short visible prefix so
people can tell keys apart and revoke one without holding it.
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tenancy.errors import ManagementError
from tenancy.models import ApiKey, Team
from tenancy.policy import TeamPolicy, policy_of

KEY_PREFIX_LEN = 12


@dataclass
class NewKey:
    key: str  # shown once, never stored
    prefix: str
    team: str


@dataclass
class KeyInfo:
    """A key as listings show it: never its hash or secret."""

    prefix: str
    team: str
    revoked: bool
    created_at: datetime
    last_used_at: datetime | None

    def record(self) -> dict[str, Any]:
        """As the CLI and the admin API show it: never a hash or a secret."""
        return {
            "prefix": self.prefix,
            "team": self.team,
            "revoked": self.revoked,
            "created_at": self.created_at.isoformat(),
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
        }


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme in any case, as HTTP has
    it), or None."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def key_prefix(authorization: str | None) -> str:
    """The visible prefix of the bearer key (as stored in ApiKey.prefix), never the secret."""
    return (bearer_key(authorization) or "")[:KEY_PREFIX_LEN]


def _new_key(team_id: int) -> tuple[str, ApiKey]:
    key = "ty-" + secrets.token_urlsafe(32)
    return key, ApiKey(prefix=key[:KEY_PREFIX_LEN], key_hash=hash_key(key), team_id=team_id)


def create_key(sql: Engine, team_name: str) -> NewKey:
    with Session(sql) as session:
        team = session.exec(select(Team).where(Team.name == team_name)).first()
        if team is None or team.id is None:
            raise ManagementError(f"no team {team_name!r}")
        key, row = _new_key(team.id)
        session.add(row)
        session.commit()
        return NewKey(key=key, prefix=row.prefix, team=team.name)


def revoke_key(sql: Engine, prefix: str) -> str:
    """Revoke the key with this prefix; returns its hash so callers can drop cached lookups."""
    with Session(sql) as session:
        api_key = session.exec(select(ApiKey).where(ApiKey.prefix == prefix)).first()
        if api_key is None:
            raise ManagementError(f"no key with prefix {prefix!r}")
        api_key.revoked = True
        session.add(api_key)
        session.commit()
        return api_key.key_hash


def rotate_key(sql: Engine, prefix: str) -> tuple[NewKey, str]:
    """A new key for the team of the key with this prefix, which is revoked in the same
    transaction. Returns the new key (its secret shown once) and the old key's hash, for the
    caller to drop its cached lookup."""
    with Session(sql) as session:
        old = session.exec(select(ApiKey).where(ApiKey.prefix == prefix)).first()
        if old is None or old.revoked:
            raise ManagementError(f"no active key with prefix {prefix!r}")
        team = session.get(Team, old.team_id)
        assert team is not None  # a key's team_id is a foreign key
        key, new = _new_key(old.team_id)
        old.revoked = True
        session.add(old)
        session.add(new)
        session.commit()
        return NewKey(key=key, prefix=new.prefix, team=team.name), old.key_hash


def list_keys(sql: Engine, team: str | None = None) -> list[KeyInfo]:
    """Keys (of one team, or all), newest first."""
    query = select(ApiKey, Team).join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
    if team is not None:
        query = query.where(Team.name == team)
    with Session(sql) as session:
        rows = session.exec(query.order_by(col(ApiKey.created_at).desc()))
        return [KeyInfo(k.prefix, t.name, k.revoked, k.created_at, k.last_used_at) for k, t in rows]


def active_key_hashes(sql: Engine, team: str) -> list[str]:
    """Hashes of a team's unrevoked keys: what to drop from the auth cache when the team changes."""
    with Session(sql) as session:
        return list(
            session.exec(
                select(ApiKey.key_hash)
                .join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
                .where(Team.name == team, ApiKey.revoked == False)  # noqa: E712
            )
        )


def lookup_key(sql: Engine, key_hash: str) -> TeamPolicy | None:
    """The team of an active key, or None. The hash is looked up by index: equality on a sha256
    of the secret, so timing reveals nothing usable about the key itself."""
    with Session(sql) as session:
        row = session.exec(
            select(ApiKey, Team)
            .join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
            .where(
                ApiKey.key_hash == key_hash,
                ApiKey.revoked == False,  # noqa: E712
                Team.disabled == False,  # noqa: E712
            )
        ).first()
        if row is None:
            return None
        api_key, team = row
        # the index lookup already matched; compare again in constant time as the rule for secrets
        if not secrets.compare_digest(api_key.key_hash, key_hash):
            return None
        return policy_of(team)
