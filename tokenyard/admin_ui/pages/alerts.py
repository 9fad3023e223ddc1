"""Budget alerts: each percent of a team's or key's dollar budget crossed (billing/alerts.py),
newest first, by team and range of days, with whether the operator's webhook took it."""

from litestar import Controller, Request, Response, get

from tokenyard.admin_ui.access import admin_only
from tokenyard.admin_ui.listing import listed_page
from tokenyard.billing import alerts


class Alerts(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/alerts")
    async def alerts(self, request: Request) -> Response:
        return await listed_page(request, "alerts.html", alerts.listed)
