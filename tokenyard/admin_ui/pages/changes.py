"""Changes: the trail of every change to teams and keys (who, what, when, before and after),
newest first, by team, a page at a time."""

from litestar import Controller, Request, Response, get

from tokenyard.admin_ui import render
from tokenyard.admin_ui.access import admin_only, tenancy_of
from tokenyard.tenancy.changes import change_record

PAGE = 50


class Changes(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/changes")
    async def changes(self, request: Request) -> Response:
        q = request.query_params
        team = q.get("team") or None
        before = q.get("before")
        older_than = int(before) if before and before.isdigit() else None
        tenancy = tenancy_of(request)
        found = await tenancy.changes(team, PAGE, older_than)
        teams = await tenancy.teams()
        return await render.page(
            request,
            "changes.html",
            rows=[change_record(c) for c in found],
            more=len(found) == PAGE,
            team=team or "",
            teams=[t.name for t in teams],
        )
