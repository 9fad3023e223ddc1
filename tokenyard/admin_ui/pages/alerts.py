"""Budget alerts: each percent of a team's or key's dollar budget crossed (billing/alerts.py),
newest first, by team and range of days, with whether the operator's webhook took it."""

from datetime import UTC, date, datetime, timedelta

from litestar import Controller, Request, Response, get

from tokenyard.admin_ui import render
from tokenyard.admin_ui.access import admin_only, in_thread, sql_of, tenancy_of
from tokenyard.billing import alerts

PAGE = 200
DAYS = 30  # the default range: the last month


def _day(raw: str | None, default: date) -> date:
    try:
        return date.fromisoformat(raw) if raw else default
    except ValueError:
        return default


class Alerts(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/alerts")
    async def alerts(self, request: Request) -> Response:
        q = request.query_params
        team = q.get("team") or None
        end = _day(q.get("end"), datetime.now(UTC).date())
        start = min(_day(q.get("start"), end - timedelta(days=DAYS - 1)), end)
        found = await in_thread(alerts.listed, sql_of(request), start, end, team, PAGE)
        for alert in found:
            alert["at"] = datetime.fromtimestamp(alert["created_at"], UTC)
        teams = await tenancy_of(request).teams()
        return await render.page(
            request,
            "alerts.html",
            rows=found,
            more=len(found) == PAGE,
            team=team or "",
            teams=[t.name for t in teams],
            start=start,
            end=end,
        )
