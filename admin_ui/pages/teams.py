"""Teams: the list with the form that creates one, and a team's page (its limits and its keys)."""

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from admin_ui import forms, render
from admin_ui.access import admin_only, in_thread, proxy_of, settings_of, sql_of
from admin_ui.pages.keys import last_used
from gateway import auth, keys
from gateway.limits import LIMIT_FIELDS, TIERS


def _catalog(request: Request) -> list[str]:
    return list(proxy_of(request).router.catalog.models)


class Teams(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    async def _teams_page(self, request: Request, form: forms.TeamForm, status: int) -> Response:
        teams = await in_thread(keys.list_teams, sql_of(request))
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
                await in_thread(
                    keys.create_team, sql_of(request), form.values["name"], **form.limits
                )
            except (keys.ManagementError, ValueError) as exc:
                form.errors["name"] = str(exc)
        if form.errors:
            return await self._teams_page(request, form, 400)
        return Redirect(f"/admin/teams/{form.values['name']}?done=created", status_code=303)

    async def _team_page(
        self, request: Request, name: str, form: forms.TeamForm | None, status: int
    ) -> Response:
        team = await in_thread(keys.get_team, sql_of(request), name)
        if team is None:
            raise NotFoundException(f"no team {name!r}")
        listed = await in_thread(keys.list_keys, sql_of(request), name)
        return await render.page(
            request,
            "team.html",
            status,
            team=team,
            form=form or forms.from_team(team),
            keys=listed,
            last_used=await last_used(request, listed),
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
            await in_thread(keys.update_team, sql_of(request), name, **form.limits)
        except keys.ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        # the change reaches every gateway once its process cache expires (gateway_key_cache_s)
        hashes = await in_thread(keys.active_key_hashes, sql_of(request), name)
        await auth.forget(proxy_of(request).quotas.redis, hashes)
        return Redirect(f"/admin/teams/{name}?done=saved", status_code=303)


def _form_context(request: Request) -> dict[str, Any]:
    return {
        "fields": list(LIMIT_FIELDS),
        "labels": forms.LABELS,
        "catalog": _catalog(request),
        "tiers": TIERS,
    }
