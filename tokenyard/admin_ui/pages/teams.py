"""Teams: the list with the form that creates one, and a team's page (its limits and its keys)."""

from datetime import UTC, datetime, timedelta
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from tokenyard.admin_ui import forms, render
from tokenyard.admin_ui.access import (
    actor_of,
    admin_only,
    in_thread,
    proxy_of,
    settings_of,
    sql_of,
    tenancy_of,
)
from tokenyard.admin_ui.pages.keys import SPEND_DAYS, key_columns
from tokenyard.billing import reports
from tokenyard.tenancy.errors import AlreadyExists, ManagementError
from tokenyard.tenancy.limits import LIMIT_FIELDS, TIERS

TOP_USERS = 10  # the team page's end users: the dearest; the admin API lists more


def _catalog(request: Request) -> list[str]:
    return list(proxy_of(request).router.catalog.models)


class Teams(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    async def _teams_page(self, request: Request, form: forms.TeamForm, status: int) -> Response:
        teams = await tenancy_of(request).teams()
        return await render.page(
            request, "teams.html", status, teams=teams, form=form, **_form_context(request)
        )

    @get("/teams")
    async def teams(self, request: Request) -> Response:
        return await self._teams_page(request, forms.from_team(None), 200)

    @post("/teams")
    async def create_team(self, request: Request) -> Response:
        form = forms.parse(await request.form(), _catalog(request), with_name=True)
        if not form.errors:
            try:
                await tenancy_of(request).create_team(
                    form.values["name"], actor=actor_of(request), **form.limits
                )
            except (ManagementError, ValueError) as exc:
                form.errors["name"] = str(exc)
        if form.errors:
            return await self._teams_page(request, form, 400)
        return Redirect(f"/admin/teams/{form.values['name']}?done=created", status_code=303)

    async def _team_page(
        self,
        request: Request,
        name: str,
        form: forms.TeamForm | None,
        status: int,
        block_error: str = "",
    ) -> Response:
        team = await tenancy_of(request).team(name)
        if team is None:
            raise NotFoundException(f"no team {name!r}")
        listed = await tenancy_of(request).keys(name)
        today = datetime.now(UTC).date()
        start = today - timedelta(days=SPEND_DAYS - 1)
        users = await in_thread(reports.by_end_user, sql_of(request), start, today, name, TOP_USERS)
        return await render.page(
            request,
            "team.html",
            status,
            team=team,
            form=form or forms.from_team(team),
            keys=listed,
            **await key_columns(request, listed, name),
            today=await proxy_of(request).quotas.used_today(name),
            end_users=users,
            end_user_days=SPEND_DAYS,
            blocked=await tenancy_of(request).blocked(name),
            block_error=block_error,
            done=request.query_params.get("done", ""),
            cache_s=settings_of(request).gateway_key_cache_s,
            **_form_context(request),
        )

    @get("/teams/{name:str}")
    async def team(self, request: Request, name: FromPath[str]) -> Response:
        return await self._team_page(request, name, None, 200)

    @post("/teams/{name:str}")
    async def update_team(self, request: Request, name: FromPath[str]) -> Response:
        form = forms.parse(await request.form(), _catalog(request), with_name=False)
        form.values["name"] = name
        if form.errors:
            return await self._team_page(request, name, form, 400)
        try:
            # it reaches every gateway once its process cache expires (gateway_key_cache_s)
            await tenancy_of(request).update_team(name, actor=actor_of(request), **form.limits)
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return Redirect(f"/admin/teams/{name}?done=saved", status_code=303)

    @post("/teams/{name:str}/block")
    async def block_user(self, request: Request, name: FromPath[str]) -> Response:
        form = await request.form()
        reason = forms.text(form, "reason").strip() or None
        try:
            await tenancy_of(request).block_end_user(
                name, forms.text(form, "user"), reason, actor=actor_of(request)
            )
        except (AlreadyExists, ValueError) as exc:  # blocked already; a blank or too long name
            return await self._team_page(request, name, None, 400, str(exc))
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return Redirect(f"/admin/teams/{name}?done=blocked", status_code=303)

    @post("/teams/{name:str}/unblock")
    async def unblock_user(self, request: Request, name: FromPath[str]) -> Response:
        user = forms.text(await request.form(), "user")
        try:
            await tenancy_of(request).unblock_end_user(name, user, actor=actor_of(request))
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return Redirect(f"/admin/teams/{name}?done=unblocked", status_code=303)


def _form_context(request: Request) -> dict[str, Any]:
    return {
        "fields": list(LIMIT_FIELDS),
        "labels": forms.LABELS,
        "catalog": _catalog(request),
        "tiers": TIERS,
    }
