"""Reading usage over a date range: the daily rollups per team, model and day (JSON-ready rows,
or CSV), each key's totals from the keys' rollups, and each end user's or each value of a
metadata key's from the records."""

import csv
import io
from datetime import date
from typing import Any

from sqlalchemy import ColumnElement, Engine, case, func
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
METADATA_CSV_COLUMNS = ("value", "team", *ROLLUP_SUMS)
# SQLite's JSON paths cannot name a key holding either: such keys are kept, not reported on
_UNREPORTABLE = ('"', "\\")
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


def _by_label(
    engine: Engine,
    start: date,
    end: date,
    team: str | None,
    limit: int,
    label: ColumnElement[Any],
) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(label, team, totals) of the records from `start` to `end` inclusive grouped by team and
    `label` (a record's column or an expression over one), dearest first, at most `limit` rows."""
    if not matchable(team):
        return []
    record = UsageRecord
    columns = [name for name in ROLLUP_SUMS if name not in ("requests", "errors")]
    # the label computed once in a subquery: grouping by an expression with a bound parameter
    # (a JSON key) would repeat it as a second parameter, which PostgreSQL will not match
    rows = select(
        record.team, label.label("label"), record.status, *(getattr(record, n) for n in columns)
    ).where(record.day >= start, record.day <= end)
    if team is not None:
        rows = rows.where(record.team == team)
    each = rows.subquery()
    sums = {name: func.sum(each.c[name]) for name in columns}
    sums |= {"requests": func.count(), "errors": func.sum(case((each.c.status != 200, 1), else_=0))}
    query = (
        select(each.c.team, each.c.label, *(column.label(n) for n, column in sums.items()))
        .group_by(each.c.team, each.c.label)
        # ties by name, the requests without a label last, in every database
        .order_by(sums["cost_usd"].desc(), sums["requests"].desc(), each.c.label.asc().nulls_last())
        .limit(limit)
    )
    with Session(engine) as session:
        found = session.exec(query).all()  # type: ignore[call-overload]
    return [(row.label, row.team, _sums_of(row)) for row in found]


def by_end_user(
    engine: Engine, start: date, end: date, team: str | None, limit: int
) -> list[dict[str, Any]]:
    """The end users' totals from `start` to `end` inclusive, dearest first, at most `limit` of
    them; each with its team (one team's, or all), `user` None for requests that named none. Read
    from the records, not a rollup: end users are the teams' own and may be many."""
    grouped = _by_label(engine, start, end, team, limit, col(UsageRecord.end_user))
    return [{"user": user, "team": name} | sums for user, name, sums in grouped]


def by_metadata(
    engine: Engine, start: date, end: date, team: str | None, key: str, limit: int
) -> list[dict[str, Any]]:
    """The totals of each value the requests' `metadata` gave `key` (a team's own labels: feature,
    project, customer tier), dearest first, at most `limit`; `value` None for requests without
    it. Read from the records, like end users."""
    if any(c in key for c in _UNREPORTABLE):
        raise ValueError("a metadata key holding a double quote or a backslash is not reported on")
    value = col(UsageRecord.request_metadata)[key].as_string()
    grouped = _by_label(engine, start, end, team, limit, value)
    return [{"value": label, "team": name} | sums for label, name, sums in grouped]


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


def labelled_to_csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """`by_end_user`'s or `by_metadata`'s totals, one line per label (empty: requests without
    one); the label is the first of `columns`."""
    first = columns[0]
    lines = [[row[first] or "", row["team"], *(row[n] for n in ROLLUP_SUMS)] for row in rows]
    return _csv(columns, lines)
