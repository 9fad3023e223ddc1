"""Budget alerts: each percent of a team's or key's dollar budget crossed (billing/alerts.py),
newest first, by team and range of days, with whether the operator's webhook took it."""

from datetime import UTC, date, datetime
from typing import Any

from litestar import Controller, Request, Response, get
from sqlalchemy import Engine

from tokenyard.admin_ui.access import admin_only
from tokenyard.admin_ui.listing import listed_page
from tokenyard.billing import alerts


def _listed(
    engine: Engine, start: date, end: date, team: str | None, limit: int
) -> list[dict[str, Any]]:
    found = alerts.listed(engine, start, end, team, limit)
    for alert in found:
        alert["at"] = datetime.fromtimestamp(alert["created_at"], UTC)
    return found


class Alerts(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/alerts")
    async def alerts(self, request: Request) -> Response:
        return await listed_page(request, "alerts.html", _listed)
