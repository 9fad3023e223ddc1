"""Every change to a team or a key, the same for the CLI, the admin API and the admin UI.

Gateways cache each key's lookup (its team's policy) in Redis and in process (gateway/auth.py). A
change that alters what keys may do (limits, disabling, deletion, revocation, rotation) is followed
by deleting the Redis entries of the keys concerned, so every gateway sees it once its own process
cache expires. Before this service each caller did that itself, and the CLI's `teams update` once
forgot to. Each change names who made it, and is recorded with it (tenancy/changes.py).
"""

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy import Engine

from tokenyard.tenancy import end_users, keys, teams
from tokenyard.tenancy.changes import list_changes
from tokenyard.tenancy.keys import KeyInfo, NewKey
from tokenyard.tenancy.models import EndUserBlock, Team, TenancyChange

log = logging.getLogger("tokenyard.tenancy")
_T = TypeVar("_T")


def cache_key(key_hash: str) -> str:
    """Where gateways cache a key's lookup in Redis."""
    return f"ty:key:{key_hash}"


class Tenancy:
    """Team and key operations over SQL (in a thread: the event loop also serves completions),
    each change followed by dropping its keys' cached lookups."""

    def __init__(self, sql: Engine, redis: aioredis.Redis) -> None:
        self.sql = sql
        self.redis = redis

    async def _run(self, operation: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.to_thread(operation, self.sql, *args, **kwargs)

    async def forget(self, key_hashes: Iterable[str]) -> None:
        """Drop these keys' cached lookups. Redis unreachable, the change still stands (it is in
        SQL): it applies once the cached entries expire, as gateways re-read them."""
        names = [cache_key(h) for h in key_hashes]
        if not names:
            return
        try:
            await self.redis.delete(*names)
        except RedisError as exc:
            log.warning("could not drop %d cached key lookups: %s", len(names), exc)

    # reads

    async def team(self, name: str) -> Team | None:
        return await self._run(teams.get_team, name)

    async def teams(self) -> list[Team]:
        return await self._run(teams.list_teams)

    async def keys(self, team: str | None = None) -> list[KeyInfo]:
        return await self._run(keys.list_keys, team)

    async def key(self, prefix: str) -> KeyInfo | None:
        return await self._run(keys.get_key, prefix)

    async def blocked(self, team: str) -> list[EndUserBlock]:
        return await self._run(end_users.list_blocked, team)

    async def changes(
        self, team: str | None, limit: int, before: int | None = None
    ) -> list[TenancyChange]:
        return await self._run(list_changes, team, limit, before)

    # changes

    # each change names who makes it (tenancy/changes.py): "admin-api:<key holder>",
    # "admin-ui:<user>", "cli:…"

    async def create_team(self, name: str, *, actor: str, **limits: Any) -> Team:
        return await self._run(teams.create_team, name, actor=actor, **limits)

    async def update_team(self, name: str, *, actor: str, **limits: Any) -> Team:
        team, hashes = await self._run(teams.update_team, name, actor=actor, **limits)
        await self.forget(hashes)
        return team

    async def set_disabled(self, name: str, disabled: bool, *, actor: str) -> Team:
        team, hashes = await self._run(teams.set_disabled, name, disabled, actor=actor)
        await self.forget(hashes)
        return team

    async def delete_team(self, name: str, *, actor: str) -> None:
        await self.forget(await self._run(teams.delete_team, name, actor=actor))

    async def create_key(
        self,
        team: str,
        name: str | None = None,
        expires_at: datetime | None = None,
        models: Sequence[str] = (),
        limits: dict[str, Any] | None = None,
        *,
        actor: str,
    ) -> NewKey:
        return await self._run(keys.create_key, team, name, expires_at, models, limits, actor=actor)

    async def block_end_user(
        self, team: str, end_user: str, reason: str | None = None, *, actor: str
    ) -> None:
        await self.forget(
            await self._run(end_users.block_end_user, team, end_user, reason, actor=actor)
        )

    async def unblock_end_user(self, team: str, end_user: str, *, actor: str) -> None:
        await self.forget(await self._run(end_users.unblock_end_user, team, end_user, actor=actor))

    async def revoke_key(self, prefix: str, *, actor: str) -> None:
        await self.forget([await self._run(keys.revoke_key, prefix, actor=actor)])

    async def update_key(self, prefix: str, *, actor: str, **changes: Any) -> KeyInfo:
        info, key_hash = await self._run(keys.update_key, prefix, actor=actor, **changes)
        await self.forget([key_hash])
        return info

    async def rotate_key(self, prefix: str, *, actor: str) -> NewKey:
        new, old_hash = await self._run(keys.rotate_key, prefix, actor=actor)
        await self.forget([old_hash])
        return new
