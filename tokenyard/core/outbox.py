"""Rows in SQL waiting to be sent somewhere at least once (budget alerts, teams' events): claimed
by one gateway at a time, marked delivered, or due again later.

A row has `id`, `created_at`, `delivered_at`, `claims` and `retry_at` (the current claim's end,
or the next try after a failure). A claim is a conditional UPDATE on the `retry_at` the claimer
read, so two gateways never send the same row at once; a gateway that dies mid-send leaves its
claim to lapse. A row is given up after `max_claims` claims or once `max_age` old.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, update
from sqlalchemy.sql import Select
from sqlmodel import Session, col, or_


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
