"""Rows in SQL waiting to be sent somewhere at least once (budget alerts, teams' events): claimed
by one gateway at a time, marked delivered, or due again later.

A row has `id`, `created_at`, `delivered_at`, `claims` and `retry_at` (the current claim's end,
or the next try after a failure). A claim is a conditional UPDATE on the `retry_at` the claimer
read, so two gateways never send the same row at once; a gateway that dies mid-send leaves its
claim to lapse. A row is given up after `max_claims` claims or once `max_age` old.
"""

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Engine, update
from sqlalchemy.sql import Select
from sqlmodel import Session, col, or_

from tokenyard.core.tasks import cancel_and_wait
from tokenyard.core.webhooks import webhook_client

log = logging.getLogger("tokenyard.webhooks")


def claim(
    engine: Engine,
    model: Any,
    query: Select,
    lease_s: float,
    max_claims: int,
    max_age: timedelta,
) -> Any:
    """The first due row `query` selects (a row of `model` first, then whatever the query joins
    to it), claimed for `lease_s`; None: nothing due, or others claimed it first."""
    now = datetime.now(UTC)
    query = query.where(
        col(model.delivered_at).is_(None),
        model.claims < max_claims,
        model.created_at >= now - max_age,
        or_(col(model.retry_at).is_(None), col(model.retry_at) <= now),
    )
    # the values read stay as read after each commit: a claim is checked against the state this
    # sender saw, never one another sender has written since
    with Session(engine, expire_on_commit=False) as session:
        for found in session.exec(query.order_by(col(model.created_at)).limit(5)).all():
            row = found[0]
            seen = col(model.retry_at)
            took = session.exec(
                update(model)
                .where(
                    col(model.id) == row.id,
                    col(model.delivered_at).is_(None),
                    seen.is_(None) if row.retry_at is None else seen == row.retry_at,
                )
                .values(claims=row.claims + 1, retry_at=now + timedelta(seconds=lease_s))
            )
            session.commit()
            if took.rowcount == 1:
                session.refresh(row)
                return found
    return None


def finish(engine: Engine, model: Any, row_id: Any, ok: bool, retry_s: float, error: str) -> None:
    """A claimed row sent (`ok`), or due again in `retry_s` with `error` noted."""
    now = datetime.now(UTC)
    done: dict[str, Any] = {"delivered_at": now, "last_error": None}
    again = {"retry_at": now + timedelta(seconds=retry_s), "last_error": error}
    with Session(engine) as session:
        session.exec(update(model).where(col(model.id) == row_id).values(**(done if ok else again)))
        session.commit()


class Sender:
    """Every gateway's loop over one outbox: send what is due, one row a `send_one`, then wait
    `poll_s`. A claim outlasts one send's tries (10 s timeout each, backoff up to a minute
    between): `lease_s`."""

    what = "outbox"  # for the log

    def __init__(self, sql: Engine, poll_s: float, attempts: int, retry_s: float) -> None:
        self.sql = sql
        self.poll_s = poll_s
        self.attempts = attempts
        self.retry_s = retry_s
        self.lease_s = attempts * 70.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        async with webhook_client() as client:
            while True:
                try:
                    while await self.send_one(client):
                        pass
                except Exception:  # SQL down, a bug: the rows wait in SQL for the next poll
                    log.exception("%s sender failed; retrying", self.what)
                await asyncio.sleep(self.poll_s)

    async def send_one(self, client: httpx.AsyncClient) -> bool:
        """Claim and send one row; False when none was due."""
        raise NotImplementedError
