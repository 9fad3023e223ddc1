"""API keys: their form, how a request's key is found and checked, and their management in SQL.

A key is `ty-` + 32 random url-safe bytes. Only its sha256 is stored, with a short visible prefix so
people can tell keys apart and revoke one without holding it. A key may carry a name (a label in
listings), an expiry, from which on it is refused like a revoked one (gateways notice within their
key-cache time, gateway_key_cache_s, twice over), a list of models that narrows its team's, and
limits of its own (requests and tokens per minute, dollars per day) enforced beside its team's.
"""

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, or_, select

from tokenyard.core.db import matchable
from tokenyard.tenancy.changes import KEY_FIELDS, SYSTEM, changed, given, record, snapshot
from tokenyard.tenancy.errors import ManagementError
from tokenyard.tenancy.limits import KEY_LIMIT_FIELDS, problem, scopes_text
from tokenyard.tenancy.lookups import find_blocks, find_key, find_team
from tokenyard.tenancy.models import ApiKey, Team
from tokenyard.tenancy.policy import TeamPolicy, model_list, policy_of

KEY_PREFIX_LEN = 12
KEY_NAME_MAX = 64


@dataclass
class NewKey:
    key: str  # shown once, never stored
    prefix: str
    team: str
    name: str | None = None
    expires_at: datetime | None = None
    models: tuple[str, ...] = ()
    limits: dict[str, Any] = field(default_factory=dict)  # the key's own: KEY_LIMIT_FIELDS


@dataclass
class KeyInfo:
    """A key as listings show it: never its hash or secret."""

    prefix: str
    team: str
    revoked: bool
    created_at: datetime
    last_used_at: datetime | None
    name: str | None = None
    expires_at: datetime | None = None
    models: tuple[str, ...] = ()
    limits: dict[str, Any] = field(default_factory=dict)  # the key's own: KEY_LIMIT_FIELDS

    @property
    def state(self) -> str:
        if self.revoked:
            return "revoked"
        return "expired" if _expired(self.expires_at) else "active"

    def record(self) -> dict[str, Any]:
        """As the CLI and the admin API show it: never a hash or a secret."""
        return {
            "prefix": self.prefix,
            "team": self.team,
            "name": self.name,
            "models": list(self.models),
            "limits": self.limits,
            "revoked": self.revoked,
            "state": self.state,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
        }


def _expired(expires_at: datetime | None) -> bool:
    return expires_at is not None and expires_at <= datetime.now(UTC)


def _models_within(team: Team, models: Sequence[str]) -> tuple[str, ...]:
    """The models a key names, stripped and each once; refuses one its team may not use."""
    wanted = tuple(dict.fromkeys(m.strip() for m in models if m.strip()))
    if any("," in m for m in wanted):
        raise ValueError("a model id has no commas")
    allowed = model_list(team.models)
    if outside := [m for m in wanted if allowed and m not in allowed]:
        raise ValueError(f"team {team.name!r} may not use {', '.join(outside)}")
    return wanted


def _limits(key: ApiKey) -> dict[str, Any]:
    return {name: getattr(key, name) for name in KEY_LIMIT_FIELDS}


def _set_limits(key: ApiKey, limits: dict[str, Any]) -> None:
    """Set some of the key's own limits (None: only the team's), each checked by the limits' one
    rule."""
    for name, value in limits.items():
        if name not in KEY_LIMIT_FIELDS:
            raise ValueError(f"a key has no limit {name!r}")
        if found := problem(name, value):
            raise ValueError(f"{name} {found}")
        if name == "model_limits" and not value:  # {} clears them, as None does
            value = None
        if name == "scopes":
            value = scopes_text(value)
        setattr(key, name, value)


def _info(key: ApiKey, team: Team) -> KeyInfo:
    return KeyInfo(
        key.prefix,
        team.name,
        key.revoked,
        key.created_at,
        key.last_used_at,
        key.name,
        key.expires_at,
        model_list(key.models),
        _limits(key),
    )


def _named(name: str | None) -> str | None:
    """The key's name, stripped (None when blank); refuses a long or unprintable one."""
    name = (name or "").strip() or None
    if name is not None and (len(name) > KEY_NAME_MAX or not name.isprintable()):
        raise ValueError(f"a key's name is 1 to {KEY_NAME_MAX} printable characters")
    return name


def _check_expiry(expires_at: datetime | None) -> None:
    if expires_at is not None and (expires_at.utcoffset() is None or _expired(expires_at)):
        raise ValueError("a key's expiry must be a time in the future, with its time zone")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme in any case, as HTTP has
    it), or None."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def _new_key(
    team_id: int,
    name: str | None = None,
    expires_at: datetime | None = None,
    models: str = "",
    limits: dict[str, Any] | None = None,
) -> tuple[str, ApiKey]:
    key = "ty-" + secrets.token_urlsafe(32)
    row = ApiKey(
        prefix=key[:KEY_PREFIX_LEN],
        key_hash=hash_key(key),
        team_id=team_id,
        name=name,
        expires_at=expires_at,
        models=models,
    )
    _set_limits(row, limits or {})
    return key, row


def create_key(
    sql: Engine,
    team_name: str,
    name: str | None = None,
    expires_at: datetime | None = None,
    models: Sequence[str] = (),
    limits: dict[str, Any] | None = None,
    *,
    actor: str = SYSTEM,
) -> NewKey:
    """A new key for the team, named, expiring, narrowed to some of the team's models and with
    limits of its own as asked (none named: the team's models, as they are when each request
    comes; no limits: only the team's)."""
    name = _named(name)
    _check_expiry(expires_at)
    with Session(sql) as session:
        team = find_team(session, team_name)
        if team is None or team.id is None:
            raise ManagementError(f"no team {team_name!r}")
        wanted = _models_within(team, models)
        key, row = _new_key(team.id, name, expires_at, ",".join(wanted), limits)
        session.add(row)
        record(session, actor, "key.create", team.name, row.prefix, given(row, KEY_FIELDS))
        session.commit()
        return NewKey(key, row.prefix, team.name, name, expires_at, wanted, _limits(row))


def revoke_key(sql: Engine, prefix: str, *, actor: str = SYSTEM) -> str:
    """Revoke the key with this prefix; returns its hash so callers can drop cached lookups."""
    with Session(sql) as session:
        row = _with_team(session, prefix)
        if row is None:
            raise ManagementError(f"no key with prefix {prefix!r}")
        api_key, team = row
        if not api_key.revoked:
            record(session, actor, "key.revoke", team.name, api_key.prefix)
        api_key.revoked = True
        session.add(api_key)
        session.commit()
        return api_key.key_hash


def _with_team(session: Session, prefix: str) -> tuple[ApiKey, Team] | None:
    """The key with this prefix and its team."""
    key = find_key(session, prefix)
    if key is None:
        return None
    team = session.get(Team, key.team_id)
    assert team is not None  # a key's team_id is a foreign key
    return key, team


def update_key(
    sql: Engine, prefix: str, *, actor: str = SYSTEM, **changes: Any
) -> tuple[KeyInfo, str]:
    """Change an unrevoked key's name, expiry, models or own limits (a field left out is kept;
    None clears a name, an expiry or a limit, an empty list the models). A new expiry may revive an
    expired key. Returns the key as listings show it, and its hash for the caller to drop its
    cached lookup."""
    if unknown := sorted(set(changes) - {"name", "expires_at", "models", *KEY_LIMIT_FIELDS}):
        raise ValueError(f"a key has no field {unknown[0]!r}")
    with Session(sql) as session:
        row = _with_team(session, prefix)
        if row is None or row[0].revoked:
            raise ManagementError(f"no active key with prefix {prefix!r}")
        key, team = row
        before = snapshot(key, KEY_FIELDS)
        if "name" in changes:
            key.name = _named(changes["name"])
        if "expires_at" in changes:
            _check_expiry(changes["expires_at"])
            key.expires_at = changes["expires_at"]
        if "models" in changes:
            key.models = ",".join(_models_within(team, changes["models"] or ()))
        _set_limits(key, {n: v for n, v in changes.items() if n in KEY_LIMIT_FIELDS})
        session.add(key)
        if difference := changed(before, snapshot(key, KEY_FIELDS)):
            record(session, actor, "key.update", team.name, key.prefix, difference)
        session.commit()
        session.refresh(key)
        return _info(key, team), key.key_hash


def rotate_key(sql: Engine, prefix: str, *, actor: str = SYSTEM) -> tuple[NewKey, str]:
    """A new key for the team of the key with this prefix, which is revoked in the same
    transaction; the new key keeps the old one's name, expiry, models and limits. Returns the new
    key (its secret shown once) and the old key's hash, for the caller to drop its cached lookup."""
    with Session(sql) as session:
        row = _with_team(session, prefix)
        if row is None or row[0].revoked:
            raise ManagementError(f"no active key with prefix {prefix!r}")
        old, team = row
        key, new = _new_key(old.team_id, old.name, old.expires_at, old.models, _limits(old))
        old.revoked = True
        session.add(old)
        session.add(new)
        record(session, actor, "key.rotate", team.name, old.prefix, {"new_prefix": new.prefix})
        session.commit()
        models = model_list(new.models)
        made = NewKey(key, new.prefix, team.name, new.name, new.expires_at, models, _limits(new))
        return made, old.key_hash


def get_key(sql: Engine, prefix: str) -> KeyInfo | None:
    """The key with this prefix, as listings show it (revoked ones too)."""
    with Session(sql) as session:
        row = _with_team(session, prefix)
        return None if row is None else _info(*row)


def list_keys(sql: Engine, team: str | None = None) -> list[KeyInfo]:
    """Keys (of one team, or all), newest first."""
    if not matchable(team):
        return []
    query = select(ApiKey, Team).join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
    if team is not None:
        query = query.where(Team.name == team)
    with Session(sql) as session:
        rows = session.exec(query.order_by(col(ApiKey.created_at).desc()))
        return [_info(k, t) for k, t in rows]


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
    """The team of an active key (not revoked, not expired, its team enabled), or None. The hash
    is looked up by index: equality on a sha256 of the secret, so timing reveals nothing usable
    about the key itself."""
    with Session(sql) as session:
        row = session.exec(
            select(ApiKey, Team)
            .join(Team, ApiKey.team_id == Team.id)  # type: ignore[arg-type]
            .where(
                ApiKey.key_hash == key_hash,
                ApiKey.revoked == False,  # noqa: E712
                Team.disabled == False,  # noqa: E712
                or_(col(ApiKey.expires_at).is_(None), col(ApiKey.expires_at) > datetime.now(UTC)),
            )
        ).first()
        if row is None:
            return None
        api_key, team = row
        # the index lookup already matched; compare again in constant time as the rule for secrets
        if not secrets.compare_digest(api_key.key_hash, key_hash):
            return None
        return policy_of(team, api_key, [b.end_user for b in find_blocks(session, team.name)])


def policy_by_prefix(sql: Engine, team_name: str, prefix: str) -> TeamPolicy | None:
    """The policy a batch job's requests run under: its team's (None once the team is gone),
    narrowed by the models of the key that created the job, found by its prefix. That key may since
    have been revoked or have expired: a job accepted runs to its end."""
    with Session(sql) as session:
        team = find_team(session, team_name)
        if team is None:
            return None
        key = find_key(session, prefix)
        key = key if key is not None and key.team_id == team.id else None
        return policy_of(team, key, [b.end_user for b in find_blocks(session, team.name)])
