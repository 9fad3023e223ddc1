"""Reading usage over a date range: the daily rollups per team, model and day (JSON-ready rows,
or CSV), and each key's totals from the keys' rollups."""

import csv
import io
from datetime import date
from typing import Any

from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from tokenyard.billing.models import ROLLUP_SUMS, UsageDaily, UsageKeyDaily
from tokenyard.core.db import matchable

CSV_COLUMNS = ("day", "team", "model", *ROLLUP_SUMS)
KEY_CSV_COLUMNS = ("key_prefix", "team", *ROLLUP_SUMS)


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
    return {
        row.key_prefix: {"team": row.team}
        | {name: getattr(row, name) for name in ROLLUP_SUMS}
        | {"total_tokens": row.prompt_tokens + row.completion_tokens}
        for row in rows
    }


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
