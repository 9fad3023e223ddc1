"""Team and API-key management: the functions the CLI and the admin UI call.

A key is `ty-` + 32 random url-safe bytes. Only its sha256 is stored, with a short visible prefix so
people can tell keys apart and revoke one without holding it.
"""

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from gateway.limits import FRACTIONS, LIMIT_FIELDS, TIERS
from gateway.models import ApiKey, Team

KEY_PREFIX_LEN = 12
# team names appear in Redis keys and metrics labels: keep them plain
# a first letter or digit: "." and ".." would otherwise be names, and break /admin/teams/{name}
TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TEAM_NAME_RULE = "1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"


class TeamPolicy(msgspec.Struct, frozen=True):
    """What the request path needs to know about a key's team; cached, so small and immutable."""

    team: str
    rpm: int = 0  # 0: unlimited (the Lua script's convention)
    tpm: int = 0
    tokens_per_day: int = 0
    batch_tokens_per_day: int = 0  # the batch tier's own daily budget, instead of tokens_per_day
    usd_per_day: float = 0.0
    concurrency: int = 0
    kv_pages: int = 0
    max_tokens: int = 0
    max_context: int = 0
    models: tuple[str, ...] = ()
    default_tier: str = "interactive"
    auto_threshold: float | None = None
    strong_share: float | None = None
    auto_quality: float | None = None


class ManagementError(Exception):
    """A management operation named a team or key that does not exist or already exists."""


class AlreadyExists(ManagementError):
    """The team to create exists already."""


@dataclass
class NewKey:
    key: str  # shown once, never stored
    prefix: str
    team: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy_of(team: Team) -> TeamPolicy:
    return TeamPolicy(
        team=team.name,
        rpm=team.rpm or 0,
        tpm=team.tpm or 0,
        tokens_per_day=team.tokens_per_day or 0,
        batch_tokens_per_day=team.batch_tokens_per_day or 0,
        usd_per_day=team.usd_per_day or 0.0,
        concurrency=team.concurrency or 0,
        kv_pages=team.kv_pages or 0,
        max_tokens=team.max_tokens or 0,
        max_context=team.max_context or 0,
        models=tuple(m for m in team.models.split(",") if m),
        default_tier=team.default_tier,
        auto_threshold=team.auto_threshold,
        strong_share=team.strong_share,
        auto_quality=team.auto_quality,
    )


def _apply(team: Team, limits: dict[str, Any]) -> None:
    for name, value in limits.items():
        if name not in LIMIT_FIELDS:
            raise ValueError(f"unknown team field {name!r}")
        if name == "default_tier" and value not in TIERS:
            raise ValueError(f"default_tier must be one of {TIERS}")
        if name in FRACTIONS and value is not None and not 0 <= value <= 1:
            raise ValueError(f"{name} must be between 0 and 1")
        if name == "models" and not isinstance(value, str):
            value = ",".join(value)
        setattr(team, name, value)


def create_team(engine: Engine, name: str, **limits: Any) -> Team:
    if not TEAM_NAME.fullmatch(name):
        raise ValueError(f"team names are {TEAM_NAME_RULE}")
    with Session(engine) as session:
        if session.exec(select(Team).where(Team.name == name)).first():
            raise AlreadyExists(f"team {name!r} already exists")
        team = Team(name=name)
        _apply(team, limits)
        session.add(team)
        session.commit()
        session.refresh(team)
        return team


def update_team(engine: Engine, name: str, **limits: Any) -> Team:
    with Session(engine) as session:
        team = session.exec(select(Team).where(Team.name == name)).first()
        if team is None:
            raise ManagementError(f"no team {name!r}")
        _apply(team, limits)
        session.add(team)
        session.commit()
        session.refresh(team)
        return team


def set_disabled(engine: Engine, name: str, disabled: bool) -> tuple[Team, list[str]]:
    """Disable (or enable) a team: its keys are refused while it is disabled. Returns the team
    and its active keys' hashes, for the caller to drop cached lookups."""
    with Session(engine) as session:
        team = session.exec(select(Team).where(Team.name == name)).first()
        if team is None:
            raise ManagementError(f"no team {name!r}")
        team.disabled = disabled
        session.add(team)
        session.commit()
        session.refresh(team)
    return team, active_key_hashes(engine, name)


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


def get_team(engine: Engine, name: str) -> Team | None:
    with Session(engine) as session:
        return session.exec(select(Team).where(Team.name == name)).first()


def list_teams(engine: Engine) -> list[Team]:
    with Session(engine) as session:
        return list(session.exec(select(Team).order_by(Team.name)))


def create_key(engine: Engine, team_name: str) -> NewKey:
    with Session(engine) as session:
        team = session.exec(select(Team).where(Team.name == team_name)).first()
        if team is None or team.id is None:
            raise ManagementError(f"no team {team_name!r}")
        key = "ty-" + secrets.token_urlsafe(32)
        prefix = key[:KEY_PREFIX_LEN]
        session.add(ApiKey(prefix=prefix, key_hash=hash_key(key), team_id=team.id))
        session.commit()
        return NewKey(key=key, prefix=prefix, team=team.name)


def revoke_key(engine: Engine, prefix: str) -> str:
    """Revoke the key with this prefix; returns its hash so callers can drop cached lookups."""
    with Session(engine) as session:
        api_key = session.exec(select(ApiKey).where(ApiKey.prefix == prefix)).first()
        if api_key is None:
            raise ManagementError(f"no key with prefix {prefix!r}")
        api_key.revoked = True
        session.add(api_key)
        session.commit()
        return api_key.key_hash


def rotate_key(engine: Engine, prefix: str) -> tuple[NewKey, str]:
    """A new key for the team of the key with this prefix, which is revoked in the same
    transaction. Returns the new key (its secret shown once) and the old key's hash, for the
    caller to drop its cached lookup."""
    with Session(engine) as session:
        old = session.exec(select(ApiKey).where(ApiKey.prefix == prefix)).first()
        if old is None or old.revoked:
            raise ManagementError(f"no active key with prefix {prefix!r}")
        team = session.get(Team, old.team_id)
        assert team is not None  # a key's team_id is a foreign key
        key = "ty-" + secrets.token_urlsafe(32)
        new = ApiKey(prefix=key[:KEY_PREFIX_LEN], key_hash=hash_key(key), team_id=old.team_id)
        old.revoked = True
        session.add(old)
        session.add(new)
        session.commit()
        return NewKey(key=key, prefix=new.prefix, team=team.name), old.key_hash


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


def delete_team(engine: Engine, name: str) -> list[str]:
    """Delete a team and its keys (so they stop working); its usage records stay, under its name.
    Returns the deleted keys' hashes, for the caller to drop cached lookups."""
    with Session(engine) as session:
        team = session.exec(select(Team).where(Team.name == name)).first()
        if team is None:
            raise ManagementError(f"no team {name!r}")
        keys = list(session.exec(select(ApiKey).where(ApiKey.team_id == team.id)))
        hashes = [k.key_hash for k in keys if not k.revoked]
        for key in keys:
            session.delete(key)
        session.delete(team)
        session.commit()
        return hashes


def list_keys(engine: Engine, team: str | None = None) -> list[KeyInfo]:
    """Keys (of one team, or all), newest first."""
    query = select(ApiKey, Team).join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
    if team is not None:
        query = query.where(Team.name == team)
    with Session(engine) as session:
        rows = session.exec(query.order_by(col(ApiKey.created_at).desc()))
        return [KeyInfo(k.prefix, t.name, k.revoked, k.created_at, k.last_used_at) for k, t in rows]


def active_key_hashes(engine: Engine, team: str) -> list[str]:
    """Hashes of a team's unrevoked keys: what to drop from the auth cache when the team changes."""
    with Session(engine) as session:
        return list(
            session.exec(
                select(ApiKey.key_hash)
                .join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
                .where(Team.name == team, ApiKey.revoked == False)  # noqa: E712
            )
        )


def lookup_key(engine: Engine, key_hash: str) -> TeamPolicy | None:
    """The team of an active key, or None. The hash is looked up by index: equality on a sha256
    of the secret, so timing reveals nothing usable about the key itself."""
    with Session(engine) as session:
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


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme in any case, as HTTP has
    it), or None."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def key_prefix(authorization: str | None) -> str:
    """The visible prefix of the bearer key (as stored in ApiKey.prefix), never the secret."""
    return (bearer_key(authorization) or "")[:KEY_PREFIX_LEN]
