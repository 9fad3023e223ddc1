"""The usage dashboard and its CSV: the admin's (every team, or one chosen) and a team member's
own (pinned to the team of the key they signed in with)."""

from litestar import Controller, Request, Response, get
from litestar.exceptions import NotAuthorizedException
from litestar.response import Redirect

from tokenyard.admin_ui import charts, render, sessions, usage
from tokenyard.admin_ui.access import admin_only, in_thread, sql_of, team_only
from tokenyard.billing import reports


async def _dashboard(request: Request, base: str, team: str | None) -> Response:
    view, notes = usage.parse_view(request.query_params, team)
    rows = await in_thread(reports.daily, sql_of(request), view.start, view.end, view.team)
    series = usage.series(rows, view)
    what = "cost (USD)" if view.metric == "cost" else "tokens"
    label = f"daily {what} by {view.by}, {view.start} to {view.end}"
    table, grand = usage.totals(rows, view.by)
    return await render.page(
        request,
        "usage.html",
        view=view,
        notes=notes,
        base=base,
        pinned=team is not None,
        chart=charts.stacked_bars(view.days(), series, view.metric, label) if rows else "",
        label=label,
        legend=charts.colours(list(series)),
        table=table,
        grand=grand,
    )


async def _csv(request: Request, team: str | None) -> Response:
    view, _ = usage.parse_view(request.query_params, team)
    rows = await in_thread(reports.daily, sql_of(request), view.start, view.end, view.team)
    name = f"usage-{view.start}-{view.end}" + (f"-{view.team}" if view.team else "") + ".csv"
    return Response(
        reports.to_csv(rows),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )


class AdminUsage(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/")
    async def home(self) -> Redirect:
        return Redirect("/admin/usage", status_code=303)

    @get("/usage")
    async def dashboard(self, request: Request) -> Response:
        return await _dashboard(request, "/admin/usage", None)

    @get("/usage.csv")
    async def usage_csv(self, request: Request) -> Response:
        return await _csv(request, None)  # the query's team, if any: parse_view checks it


class TeamUsage(Controller):
    """A team member's own usage, opened with the team's key; nobody else's."""

    guards = [team_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/team-usage")
    async def dashboard(self, request: Request) -> Response:
        return await _dashboard(request, "/admin/team-usage", await _own_team(request))

    @get("/team-usage.csv")
    async def usage_csv(self, request: Request) -> Response:
        return await _csv(request, await _own_team(request))


async def _own_team(request: Request) -> str:
    session = await sessions.load(request)
    if session is None or session.team is None:  # the guard let it through: cannot happen
        raise NotAuthorizedException("sign in with your team's API key")
    return session.team
