"""Reading usage over a date range: the daily rollups per team, model and day (JSON-ready rows,
or CSV), each key's totals from the keys' rollups, and each end user's from the records."""

import csv
import io
from datetime import date
from typing import Any

from sqlalchemy import Engine, case, func
from sqlmodel import Session, col, select

from tokenyard.billing.models import (
    ROLLUP_SUMS,
    RollupSums,
    UsageDaily,
    UsageKeyDaily,
    UsageRecord,
)
from tokenyard.core.db import matchable

CSV_COLUMNS = ("day", "team", "model", *ROLLUP_SUMS)
KEY_CSV_COLUMNS = ("key_prefix", "team", *ROLLUP_SUMS)
USER_CSV_COLUMNS = ("user", "team", *ROLLUP_SUMS)
_KINDS = {name: RollupSums.model_fields[name].annotation for name in ROLLUP_SUMS}


def daily(engine: Engine, start: date, end: date, team: str | None = None) -> list[UsageDaily]:
    """Rollup rows from `start` to `end` inclusive, of one team or (None) all teams."""
    if not matchable(team):
        return []
    query = select(UsageDaily).where(UsageDaily.day >= start, UsageDaily.day <= end)
    if team is not None:
        query = query.where(UsageDaily.team == team)
    query = query.order_by(col(UsageDaily.day), col(UsageDaily.team), col(UsageDaily.model))
    with Session(engine) as session:
        return list(session.exec(query))


def _sums_of(row: Any) -> dict[str, Any]:
    """A grouped row's sums as their columns' types, and its total tokens. PostgreSQL sums 64-bit
    counts as NUMERIC, which arrives as a Decimal (and would reach JSON as a string)."""
    sums = {name: _KINDS[name](getattr(row, name) or 0) for name in ROLLUP_SUMS}
    return sums | {"total_tokens": sums["prompt_tokens"] + sums["completion_tokens"]}


def by_key(
    engine: Engine, start: date, end: date, team: str | None = None
) -> dict[str, dict[str, Any]]:
    """Each key's totals from `start` to `end` inclusive, by its prefix (with its team), of one
    team or all, from the keys' daily rollups."""
    if not matchable(team):
        return {}
    rollup = UsageKeyDaily
    sums = [func.sum(getattr(rollup, name)).label(name) for name in ROLLUP_SUMS]
    query = select(rollup.team, rollup.key_prefix, *sums).where(
        rollup.day >= start, rollup.day <= end
    )
    if team is not None:
        query = query.where(rollup.team == team)
    query = query.group_by(col(rollup.team), col(rollup.key_prefix))
    with Session(engine) as session:
        rows = session.exec(query).all()  # type: ignore[call-overload]
    return {row.key_prefix: {"team": row.team} | _sums_of(row) for row in rows}


def by_end_user(
    engine: Engine, start: date, end: date, team: str | None, limit: int
) -> list[dict[str, Any]]:
    """The end users' totals from `start` to `end` inclusive, dearest first, at most `limit` of
    them; each with its team (one team's, or all), `user` None for requests that named none. Read
    from the records, not a rollup: end users are the teams' own and may be many."""
    if not matchable(team):
        return []
    record = UsageRecord
    sums = {
        name: func.sum(getattr(record, name))
        for name in ROLLUP_SUMS
        if name not in ("requests", "errors")  # counted, not columns of a record
    }
    sums |= {"requests": func.count(), "errors": func.sum(case((record.status != 200, 1), else_=0))}
    query = select(
        record.team, record.end_user, *(column.label(name) for name, column in sums.items())
    ).where(record.day >= start, record.day <= end)
    if team is not None:
        query = query.where(record.team == team)
    query = (
        query.group_by(col(record.team), col(record.end_user))
        # ties by name, the requests that named none last, in every database
        .order_by(
            sums["cost_usd"].desc(),
            sums["requests"].desc(),
            col(record.end_user).asc().nulls_last(),
        )
        .limit(limit)
    )
    with Session(engine) as session:
        rows = session.exec(query).all()  # type: ignore[call-overload]
    return [{"user": row.end_user, "team": row.team} | _sums_of(row) for row in rows]


def _totals(rows: list[UsageDaily]) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(ROLLUP_SUMS, 0)
    for row in rows:
        for name in ROLLUP_SUMS:
            out[name] += getattr(row, name)
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    return out


def summary(rows: list[UsageDaily]) -> dict[str, Any]:
    """The range's totals, per model, and each day's rows."""
    by_model: dict[str, list[UsageDaily]] = {}
    for row in rows:
        by_model.setdefault(row.model, []).append(row)
    return {
        "models": {model: _totals(group) for model, group in sorted(by_model.items())},
        **_totals(rows),
        "data": [
            {"day": row.day.isoformat(), "team": row.team, "model": row.model}
            | {name: getattr(row, name) for name in ROLLUP_SUMS}
            for row in rows
        ],
    }


def _csv(columns: tuple[str, ...], rows: list[list[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for cells in rows:
        # dollars to the nano-dollar: summed floats would otherwise print their rounding noise
        writer.writerow([round(c, 9) if isinstance(c, float) else c for c in cells])
    return out.getvalue()


def to_csv(rows: list[UsageDaily]) -> str:
    return _csv(CSV_COLUMNS, [[getattr(row, name) for name in CSV_COLUMNS] for row in rows])


def keys_to_csv(per_key: dict[str, dict[str, Any]]) -> str:
    """`by_key`'s totals, one line per key prefix."""
    lines = [[p, k["team"], *(k[n] for n in ROLLUP_SUMS)] for p, k in sorted(per_key.items())]
    return _csv(KEY_CSV_COLUMNS, lines)


def users_to_csv(per_user: list[dict[str, Any]]) -> str:
    """`by_end_user`'s totals, one line per end user (empty: requests that named none)."""
    lines = [[u["user"] or "", u["team"], *(u[n] for n in ROLLUP_SUMS)] for u in per_user]
    return _csv(USER_CSV_COLUMNS, lines)
