"""Requests: each request's record (billing/request_log.py), newest first, by team, model, end
user, request id or errors only, a page at a time."""

from litestar import Controller, Request, Response, get

from tokenyard.admin_ui import render
from tokenyard.admin_ui.access import admin_only, in_thread, sql_of, tenancy_of
from tokenyard.billing import request_log

PAGE = 100


class Requests(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/requests")
    async def requests(self, request: Request) -> Response:
        q = request.query_params
        shown = {name: q.get(name) or "" for name in ("team", "model", "user", "request_id")}
        errors = q.get("status") == "error"
        before = q.get("before")
        filters = request_log.Filters(
            model=shown["model"] or None,
            end_user=shown["user"] or None,
            request_id=shown["request_id"] or None,
            errors=errors,
        )
        rows = await in_thread(
            request_log.recent,
            sql_of(request),
            shown["team"] or None,
            filters,
            PAGE,
            int(before) if before and before.isdigit() else None,
        )
        teams = await tenancy_of(request).teams()
        return await render.page(
            request,
            "requests.html",
            rows=rows,
            more=len(rows) == PAGE,
            shown=shown,
            errors=errors,
            teams=[t.name for t in teams],
        )
