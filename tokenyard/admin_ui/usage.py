"""The dashboard's view (range, grouping, metric, team) and the daily rollups grouped for it.

Rows come from billing.reports.daily; this only groups them for the chart and the totals table.
"""

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal
from urllib.parse import urlencode

from tokenyard.billing.api import MAX_DAYS
from tokenyard.billing.models import ROLLUP_SUMS, UsageDaily
from tokenyard.tenancy.teams import TEAM_NAME

DEFAULT_DAYS = 30
MAX_SERIES = 8  # more would be unreadable colours: the rest is drawn as "other"
OTHER = "other"
EARLIEST = date(2000, 1, 1)  # no usage is older; a range's start can be counted back from any end


@dataclass(frozen=True)
class View:
    start: date
    end: date
    by: Literal["team", "model"]
    metric: Literal["tokens", "cost"]
    team: str | None = None  # drill-down: one team's usage

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def query(self, **changes: Any) -> str:
        """This view's query string, with some fields changed."""
        view = replace(self, **changes)
        params = {
            "start": view.start.isoformat(),
            "end": view.end.isoformat(),
            "by": view.by,
            "metric": view.metric,
        }
        if view.team:
            params["team"] = view.team
        return urlencode(params)


def _date(raw: str | None, default: date, what: str, notes: list[str]) -> date:
    if not raw:
        return default
    try:
        parsed = date.fromisoformat(raw)
    except ValueError:
        parsed = None
    if parsed is None or parsed < EARLIEST:
        notes.append(
            f"{what} {raw!r} is not a date (YYYY-MM-DD, from {EARLIEST}): showing {default}"
        )
        return default
    return parsed


def parse_view(params: Any, team: str | None = None) -> tuple[View, list[str]]:
    """The view asked for in query parameters; what could not be honoured is said in the notes.
    `team` pins the view to one team (a team member's page)."""
    notes: list[str] = []
    today = datetime.now(UTC).date()
    end = _date(params.get("end"), today, "end", notes)
    start = _date(params.get("start"), end - timedelta(days=DEFAULT_DAYS - 1), "start", notes)
    if start > end:
        notes.append("the start was after the end: swapped")
        start, end = end, start
    if (end - start).days >= MAX_DAYS:
        start = end - timedelta(days=MAX_DAYS - 1)
        notes.append(f"a range spans at most {MAX_DAYS} days: starting {start}")
    asked = params.get("team") or None
    if not team and asked and not TEAM_NAME.fullmatch(asked):
        notes.append(f"{asked!r} is not a team name: showing every team")
        asked = None
    team = team or asked
    by = params.get("by") or ("model" if team else "team")
    metric = params.get("metric") or "tokens"
    return View(
        start,
        end,
        by if by in ("team", "model") else "team",
        metric if metric in ("tokens", "cost") else "tokens",
        team,
    ), notes


def value(row: UsageDaily, metric: str) -> float:
    return row.cost_usd if metric == "cost" else row.prompt_tokens + row.completion_tokens


def series(rows: list[UsageDaily], view: View) -> dict[str, dict[date, float]]:
    """Per team or model (the largest first; past MAX_SERIES folded into "other"): day → value."""
    out: dict[str, dict[date, float]] = {}
    for row in rows:
        days = out.setdefault(getattr(row, view.by), {})
        days[row.day] = days.get(row.day, 0.0) + value(row, view.metric)
    ranked = sorted(out, key=lambda name: -sum(out[name].values()))
    if len(ranked) <= MAX_SERIES:
        return {name: out[name] for name in ranked}
    kept = {name: out[name] for name in ranked[: MAX_SERIES - 1]}
    other: dict[date, float] = {}
    for name in ranked[MAX_SERIES - 1 :]:
        for day, v in out[name].items():
            other[day] = other.get(day, 0.0) + v
    return kept | {OTHER: other}


def totals(rows: list[UsageDaily], by: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The table beneath the chart: one row per team or model (most expensive first), and the
    range's total."""
    groups: dict[str, dict[str, Any]] = {}
    grand: dict[str, Any] = dict.fromkeys(ROLLUP_SUMS, 0)
    for row in rows:
        group = groups.setdefault(getattr(row, by), dict.fromkeys(ROLLUP_SUMS, 0))
        for name in ROLLUP_SUMS:
            group[name] += getattr(row, name)
            grand[name] += getattr(row, name)
    table = [{"name": name} | sums for name, sums in groups.items()]
    for entry in [*table, grand]:
        entry["total_tokens"] = entry["prompt_tokens"] + entry["completion_tokens"]
    table.sort(key=lambda e: (-e["cost_usd"], -e["total_tokens"], e["name"]))
    return table, grand
