"""Pages that list rows by team and range of days, newest first (budget alerts, webhook events):
the range a page asks for, and the page drawn from a lister's rows."""

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from litestar import Request, Response
from sqlalchemy import Engine

from tokenyard.admin_ui import render
from tokenyard.admin_ui.access import in_thread, sql_of, tenancy_of

PAGE = 200
DAYS = 30  # the default range: the last month

# (engine, first day, last day, team or None for all, at most) → rows, newest first
Lister = Callable[[Engine, date, date, str | None, int], list[dict[str, Any]]]


def _day(raw: str | None, default: date) -> date:
    try:
        return date.fromisoformat(raw) if raw else default
    except ValueError:
        return default


def days_of(query: Any) -> tuple[date, date]:
    """The range of UTC days a page's `start` and `end` ask for: the last DAYS by default."""
    end = _day(query.get("end"), datetime.now(UTC).date())
    return min(_day(query.get("start"), end - timedelta(days=DAYS - 1)), end), end


async def listed_page(request: Request, template: str, lister: Lister, **extra: Any) -> Response:
    q = request.query_params
    team = q.get("team") or None
    start, end = days_of(q)
    found = await in_thread(lister, sql_of(request), start, end, team, PAGE)
    teams = await tenancy_of(request).teams()
    return await render.page(
        request,
        template,
        rows=found,
        more=len(found) == PAGE,
        team=team or "",
        teams=[t.name for t in teams],
        start=start,
        end=end,
        **extra,
    )
