"""Reading the daily rollups per team, model and day over a date range: JSON-ready rows, or CSV."""

import csv
import io
from datetime import date
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tokenyard.billing.models import ROLLUP_SUMS, UsageDaily

CSV_COLUMNS = ("day", "team", "model", *ROLLUP_SUMS)


def daily(engine: Engine, start: date, end: date, team: str | None = None) -> list[UsageDaily]:
    """Rollup rows from `start` to `end` inclusive, of one team or (None) all teams."""
    query = select(UsageDaily).where(UsageDaily.day >= start, UsageDaily.day <= end)
    if team is not None:
        query = query.where(UsageDaily.team == team)
    query = query.order_by(col(UsageDaily.day), col(UsageDaily.team), col(UsageDaily.model))
    with Session(engine) as session:
        return list(session.exec(query))


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


def to_csv(rows: list[UsageDaily]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        cells = (getattr(row, name) for name in CSV_COLUMNS)
        # dollars to the nano-dollar: summed floats would otherwise print their rounding noise
        writer.writerow([round(c, 9) if isinstance(c, float) else c for c in cells])
    return out.getvalue()
