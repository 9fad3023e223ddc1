"""Team policies and audit rows in SQL, kept off the request path.

Policies: read through two short-lived caches (this process, then Redis), as the gateway caches
teams (gateway/auth.py); a change deletes the Redis entry, so every gateway sees it within the
in-process TTL. Audit rows: queued in memory by the request and written by a background task in
batches; a full queue drops rows (counted in tokenyard_guard_audit_dropped_total) rather than
slow a request.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tokenyard.core.db import matchable
from tokenyard.core.tasks import cancel_and_wait
from tokenyard.guard import metrics
from tokenyard.guard.models import GuardAudit, GuardPolicy
from tokenyard.guard.policy import DEFAULT, Policy, decode, encode

log = logging.getLogger("tokenyard.guard")
_MAX_LOCAL = 10_000


def cache_key(team: str) -> str:
    return f"ty:guard-policy:{team}"


# ---- policies (SQL functions for the CLI and the admin UI; a cache for the request path) --------


def read_policy(sql: Engine, team: str) -> Policy | None:
    with Session(sql) as session:
        row = session.get(GuardPolicy, team)
        return decode(row.policy) if row else None


def write_policy(sql: Engine, team: str, policy: Policy) -> None:
    with Session(sql) as session:
        row = session.get(GuardPolicy, team) or GuardPolicy(team=team, policy="")
        row.policy = encode(policy)
        row.updated_at = datetime.now(UTC)
        session.add(row)
        session.commit()


def delete_policy(sql: Engine, team: str) -> bool:
    with Session(sql) as session:
        row = session.get(GuardPolicy, team)
        if row is None:
            return False
        session.delete(row)
        session.commit()
        return True


def policy_teams(sql: Engine) -> list[str]:
    with Session(sql) as session:
        return list(session.exec(select(GuardPolicy.team).order_by(GuardPolicy.team)))


async def forget(redis: aioredis.Redis, team: str) -> None:
    with contextlib.suppress(RedisError):
        await redis.delete(cache_key(team))


class PolicyCache:
    def __init__(self, sql: Engine, redis: aioredis.Redis | None, ttl: float) -> None:
        self.sql = sql
        self.redis = redis
        self.ttl = ttl
        self._local: dict[str, tuple[float, Policy]] = {}

    async def get(self, team: str) -> Policy:
        now = time.monotonic()
        hit = self._local.get(team)
        if hit is not None and hit[0] > now:
            return hit[1]
        policy = await self._from_redis_or_sql(team)
        if len(self._local) >= _MAX_LOCAL:
            self._local.clear()
        self._local[team] = (now + self.ttl, policy)
        return policy

    async def _from_redis_or_sql(self, team: str) -> Policy:
        name = cache_key(team)
        if self.redis is not None:
            try:
                cached = await self.redis.get(name)
            except RedisError:
                cached = None
            if cached is not None:
                return decode(cached) if cached != b"-" else DEFAULT
        found = await asyncio.to_thread(read_policy, self.sql, team)
        if self.redis is not None:
            with contextlib.suppress(RedisError):
                value = encode(found) if found is not None else "-"
                await self.redis.set(name, value, px=max(int(self.ttl * 1000), 1))
        return found or DEFAULT


# ---- the audit log -----------------------------------------------------------------------------


def audit_rows(
    sql: Engine,
    team: str | None = None,
    action: str | None = None,
    direction: str | None = None,
    request_id: str | None = None,
    limit: int = 100,
    before_id: int | None = None,
    end_user: str | None = None,
) -> list[GuardAudit]:
    if not matchable(team, action, direction, request_id, end_user):
        return []
    with Session(sql) as session:
        query = select(GuardAudit)
        if team:
            query = query.where(GuardAudit.team == team)
        if action:
            query = query.where(GuardAudit.action == action)
        if direction:
            query = query.where(GuardAudit.direction == direction)
        if request_id:
            query = query.where(GuardAudit.request_id == request_id)
        if end_user:
            query = query.where(GuardAudit.end_user == end_user)
        if before_id is not None:
            query = query.where(col(GuardAudit.id) < before_id)
        query = query.order_by(col(GuardAudit.id).desc()).limit(limit)
        return list(session.exec(query))


class AuditLog:
    def __init__(self, sql: Engine, max_queue: int = 10_000, batch: int = 200) -> None:
        self.sql = sql
        self.batch = batch
        self.queue: asyncio.Queue[GuardAudit] = asyncio.Queue(max_queue)
        self._task: asyncio.Task[None] | None = None

    def record(
        self,
        *,
        request_id: str,
        team: str,
        direction: str,
        action: str,
        categories: Sequence[str],
        scores: dict[str, float],
        model: str,
        text: str | None,
        end_user: str | None = None,
    ) -> None:
        row = GuardAudit(
            request_id=request_id,
            team=team,
            direction=direction,
            action=action,
            categories=",".join(categories),
            scores=json.dumps({k: round(v, 4) for k, v in scores.items()}),
            model=model,
            end_user=end_user,  # the gateway refuses one holding NUL (validation.Label)
            # PostgreSQL's text holds no NUL, and one such row would fail its whole batch's commit
            text=text.replace("\x00", "\ufffd") if text else text,
        )
        try:
            self.queue.put_nowait(row)
        except asyncio.QueueFull:
            metrics.AUDIT_DROPPED.inc()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await self.flush()

    async def flush(self) -> None:
        rows: list[GuardAudit] = []
        while not self.queue.empty():
            rows.append(self.queue.get_nowait())
        if rows:
            await asyncio.to_thread(self._write, rows)

    def _write(self, rows: list[GuardAudit]) -> None:
        with Session(self.sql) as session:
            session.add_all(rows)
            session.commit()

    async def _run(self) -> None:
        while True:
            rows = [await self.queue.get()]
            while len(rows) < self.batch and not self.queue.empty():
                rows.append(self.queue.get_nowait())
            try:
                await asyncio.to_thread(self._write, rows)
            except Exception as exc:  # SQL down: the rows are lost, the requests are not
                metrics.AUDIT_DROPPED.inc(len(rows))
                log.warning("audit rows lost (%d): %s", len(rows), exc)
                await asyncio.sleep(0.5)


def to_dict(row: GuardAudit) -> dict[str, Any]:
    return {
        "id": row.id,
        "created_at": row.created_at.isoformat() if row.created_at else None,
        "request_id": row.request_id,
        "team": row.team,
        "direction": row.direction,
        "action": row.action,
        "categories": [c for c in row.categories.split(",") if c],
        "scores": json.loads(row.scores),
        "model": row.model,
        "end_user": row.end_user,
        "text": row.text,
    }
