"""Writing usage records to SQL: a batch of rows in one transaction, idempotent by request id, the
daily rollups updated in the same transaction for exactly the rows that were new."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Table, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from tokenyard.billing import metrics
from tokenyard.billing.models import (
    ROLLUP_SUMS,
    BudgetAlert,
    UsageDaily,
    UsageKeyDaily,
    UsageRecord,
)

_RECORDS: Table = UsageRecord.__table__  # type: ignore[attr-defined]
_ALERTS: Table = BudgetAlert.__table__  # type: ignore[attr-defined]
# what writing a row may raise: SQLAlchemy's errors, and sqlite3's own for an integer beyond 64 bits
_REFUSALS = (SQLAlchemyError, OverflowError)
_INSERTS: dict[str, Callable[[Table], Insert]] = {
    "sqlite": sqlite.insert,
    "postgresql": postgresql.insert,
}


@dataclass(frozen=True)
class _Rollup:
    table: Table
    by: dict[str, str]  # the rollup's key columns, each from a record's column

    def add(self, conn: Connection, insert: Callable[[Table], Insert], rows: list[dict]) -> None:
        deltas: dict[tuple, dict[str, Any]] = {}
        for row in rows:
            key = tuple(row[column] for column in self.by.values())
            delta = deltas.setdefault(key, dict.fromkeys(ROLLUP_SUMS, 0))
            delta["requests"] += 1
            delta["errors"] += row["status"] != 200
            for name in ROLLUP_SUMS[2:]:
                delta[name] += row[name]
        if not deltas:
            return
        # sorted: concurrent writers lock rollup rows in one order (no deadlocks on PostgreSQL)
        lines = [dict(zip(self.by, key, strict=True)) | d for key, d in sorted(deltas.items())]
        up = insert(self.table)
        add = {name: self.table.c[name] + up.excluded[name] for name in ROLLUP_SUMS}
        conn.execute(up.on_conflict_do_update(index_elements=list(self.by), set_=add), lines)


_DAILY = _Rollup(
    UsageDaily.__table__,  # type: ignore[attr-defined]
    {"day": "day", "team": "team", "model": "model_served"},
)
_KEY_DAILY = _Rollup(
    UsageKeyDaily.__table__,  # type: ignore[attr-defined]
    {"day": "day", "team": "team", "key_prefix": "key_prefix"},
)


def reachable(engine: Engine) -> bool:
    """Whether SQL answers at all: tells a database that is down from one that refuses a row."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return False
    return True


def write_or_isolate(
    engine: Engine, rows: list[dict[str, Any]], alerts: Sequence[dict[str, Any]] = ()
) -> list[tuple[int, str]]:
    """Write the rows (and the budget alerts of their requests); if SQL answers but refuses the
    batch, write them one by one and return (index, reason) of each row it refuses on its own:
    such a row can never be written, and retrying its batch would stall every event behind it.
    Raises while SQL is unreachable."""
    try:
        write(engine, rows, alerts)
        return []
    except _REFUSALS:
        pass  # SQL is down, or refuses a row: row by row tells which
    refused = []
    for i, row in enumerate(rows):
        try:
            write(engine, [row], alerts)
        except _REFUSALS as exc:
            if not reachable(engine):
                raise
            refused.append((i, exc.__class__.__name__))
    return refused


def write(engine: Engine, rows: list[dict[str, Any]], alerts: Sequence[dict[str, Any]] = ()) -> int:
    """Insert the rows whose request id is not stored yet and add them to the rollups, with the
    budget alerts of those rows' requests (each alert once, however often delivered); returns how
    many rows were new. All or nothing: on any error nothing is written."""
    unique = list({row["request_id"]: row for row in reversed(rows)}.values())[::-1]
    if not unique:
        return 0
    insert = _INSERTS[engine.dialect.name]
    ids = {row["request_id"] for row in unique}
    crossed = [alert for alert in alerts if alert["request_id"] in ids]
    with engine.begin() as conn:
        if crossed:
            stmt = insert(_ALERTS).on_conflict_do_nothing().returning(_ALERTS.c.budget)
            for budget in conn.execute(stmt, crossed).scalars():
                metrics.BUDGET_ALERTS.labels(budget).inc()
        stmt = (
            insert(_RECORDS)
            .on_conflict_do_nothing(index_elements=["request_id"])
            .returning(_RECORDS.c.request_id)
        )
        # executemany: SQLAlchemy batches it into multi-row INSERTs from one cached compilation
        inserted = set(conn.execute(stmt, unique).scalars())
        new = [row for row in unique if row["request_id"] in inserted]
        _DAILY.add(conn, insert, new)
        _KEY_DAILY.add(conn, insert, [row for row in new if row["key_prefix"]])
    return len(new)
