"""The /admin router the gateway mounts: sign-in, teams, keys, the usage dashboard, live status,
and a team's own usage page. Every route but the sign-in forms and the stylesheet needs a session
(guards); every form is CSRF-checked (csrf.verify, before each handler)."""

import asyncio
import hmac
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import quote

from litestar import Controller, Request, Response, Router, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException, NotFoundException
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.response import Redirect
from sqlalchemy import Engine

from admin_ui import charts, csrf, forms, render, sessions, status, throttle, usage
from billing import reports
from core.errors import GatewayError
from core.settings import Settings
from gateway import auth, keys
from gateway.limits import LIMIT_FIELDS, TIERS

_CSS = (Path(__file__).parent / "static" / "admin.css").read_bytes()


def _proxy(connection: ASGIConnection) -> Any:
    return connection.app.state.proxy


def _sql(connection: ASGIConnection) -> Engine:
    return _proxy(connection).auth.sql


def _settings(connection: ASGIConnection) -> Settings:
    return _proxy(connection).settings


async def _db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """SQL off the event loop: it also serves completions."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _admin_credential(settings: Settings) -> str:
    # the first call of a process hashes (scrypt): off the event loop
    return await asyncio.to_thread(
        sessions.fingerprint, settings.admin_user, settings.admin_password.get_secret_value()
    )


async def admin_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The admin's session, opened with the admin user and password this gateway has now."""
    session = await sessions.load(connection)
    settings = _settings(connection)
    if session is None or session.role != "admin" or not settings.admin_password:
        raise NotAuthorizedException("sign in as the platform admin")
    current = await _admin_credential(settings)
    if not hmac.compare_digest(session.credential or "", current):
        raise NotAuthorizedException("the admin sign-in changed: sign in again")


async def team_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """A team member's session, while the key it was opened with still works."""
    session = await sessions.load(connection)
    if session is None or session.role != "team" or session.key_hash is None:
        raise NotAuthorizedException("sign in with your team's API key")
    policy = await _db(keys.lookup_key, _sql(connection), session.key_hash)
    if policy is None or policy.team != session.team:
        raise NotAuthorizedException("that key was revoked: sign in with a current key")


def _local_next(raw: str | None, default: str) -> str:
    """Where to go after signing in: only a path of this UI, never another site."""
    if raw and raw.startswith("/admin") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return default


def refuse(request: Request, exc: HTTPException) -> Response:
    """Anonymous page views go to the sign-in form; anything else gets an error page."""
    if exc.status_code == 401 and request.method == "GET":
        login = (
            "/admin/team-usage/login"
            if request.url.path.startswith("/admin/team-usage")
            else ("/admin/login")
        )
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return Redirect(f"{login}?next={quote(target)}", status_code=303)
    return render.error(exc.status_code, str(exc.detail))


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _admitted(request: Request) -> bool:
    return await throttle.admit(_proxy(request).quotas.redis, _client(request))


async def _succeeded(request: Request) -> None:
    await throttle.succeeded(_proxy(request).quotas.redis, _client(request))


def _same(given: str, expected: str) -> bool:
    # digests: equal lengths, so the comparison's time says nothing about the length either
    return hmac.compare_digest(sha256(given.encode()).digest(), sha256(expected.encode()).digest())


_THROTTLED = "too many failed sign-ins: wait a few minutes"


async def _login_page(request: Request, kind: str, status: int = 200, error: str = "") -> Response:
    off = kind == "admin" and not _settings(request).admin_password
    return await render.page(request, "login.html", status, kind=kind, error=error, off=off)


class SignIn(Controller):
    """The only routes open to anonymous visitors: the sign-in forms and the stylesheet."""

    @get("/static/admin.css")
    async def stylesheet(self) -> Response[bytes]:
        return Response(_CSS, media_type="text/css", headers={"cache-control": "max-age=3600"})

    @get("/login")
    async def login_form(self, request: Request) -> Response:
        return await _login_page(request, "admin")

    @post("/login")
    async def login(self, request: Request) -> Response:
        settings = _settings(request)
        form = await request.form()
        if not settings.admin_password:
            return await _login_page(request, "admin", 403)
        if not await _admitted(request):
            return await _login_page(request, "admin", 429, _THROTTLED)
        ok_user = _same(forms.text(form, "user"), settings.admin_user)
        password = settings.admin_password.get_secret_value()
        ok_password = _same(forms.text(form, "password"), password)
        if not (ok_user and ok_password):
            return await _login_page(request, "admin", 401, "wrong user name or password")
        await _succeeded(request)
        response = Redirect(
            _local_next(request.query_params.get("next"), "/admin/usage"), status_code=303
        )
        await sessions.start(
            request,
            response,
            "admin",
            settings.admin_session_s,
            credential=await _admin_credential(settings),
        )
        return response

    @get("/team-usage/login")
    async def team_login_form(self, request: Request) -> Response:
        return await _login_page(request, "team")

    @post("/team-usage/login")
    async def team_login(self, request: Request) -> Response:
        key = forms.text(await request.form(), "key").strip()
        if not await _admitted(request):
            return await _login_page(request, "team", 429, _THROTTLED)
        try:
            policy = await _proxy(request).auth.authenticate(f"Bearer {key}")
        except GatewayError:
            return await _login_page(request, "team", 401, "that key is not valid (or was revoked)")
        await _succeeded(request)
        response = Redirect("/admin/team-usage", status_code=303)
        await sessions.start(
            request,
            response,
            "team",
            _settings(request).admin_session_s,
            team=policy.team,
            key_hash=keys.hash_key(key),
        )
        return response

    @post("/logout")
    async def logout(self, request: Request) -> Response:
        session = await sessions.load(request)
        target = "/admin/team-usage/login" if session and session.role == "team" else "/admin/login"
        response = Redirect(target, status_code=303)
        await sessions.end(request, response)
        return response


async def _dashboard(request: Request, base: str, team: str | None) -> Response:
    view, notes = usage.parse_view(request.query_params, team)
    rows = await _db(reports.daily, _sql(request), view.start, view.end, view.team)
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
    rows = await _db(reports.daily, _sql(request), view.start, view.end, view.team)
    name = f"usage-{view.start}-{view.end}" + (f"-{view.team}" if view.team else "") + ".csv"
    return Response(
        reports.to_csv(rows),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )


async def _last_used(request: Request, listed: list[keys.KeyInfo]) -> dict[str, datetime | None]:
    """Each key's last use: the gateways' Redis record, else the SQL column."""
    if not listed:
        return {}
    stamps = await _proxy(request).quotas.redis.hmget(auth.LAST_USED, [k.prefix for k in listed])
    return {
        k.prefix: datetime.fromtimestamp(int(s), UTC) if s else k.last_used_at
        for k, s in zip(listed, stamps, strict=True)
    }


def _catalog(request: Request) -> list[str]:
    return list(_proxy(request).router.catalog.models)


class Admin(Controller):
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

    async def _teams_page(self, request: Request, form: forms.TeamForm, status: int) -> Response:
        teams = await _db(keys.list_teams, _sql(request))
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
                await _db(keys.create_team, _sql(request), form.values["name"], **form.limits)
            except (keys.ManagementError, ValueError) as exc:
                form.errors["name"] = str(exc)
        if form.errors:
            return await self._teams_page(request, form, 400)
        return Redirect(f"/admin/teams/{form.values['name']}?done=created", status_code=303)

    async def _team_page(
        self, request: Request, name: str, form: forms.TeamForm | None, status: int
    ) -> Response:
        team = await _db(keys.get_team, _sql(request), name)
        if team is None:
            raise NotFoundException(f"no team {name!r}")
        listed = await _db(keys.list_keys, _sql(request), name)
        return await render.page(
            request,
            "team.html",
            status,
            team=team,
            form=form or forms.from_team(team),
            keys=listed,
            last_used=await _last_used(request, listed),
            done=request.query_params.get("done", ""),
            cache_s=_settings(request).gateway_key_cache_s,
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
            await _db(keys.update_team, _sql(request), name, **form.limits)
        except keys.ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        # the change reaches every gateway once its process cache expires (gateway_key_cache_s)
        hashes = await _db(keys.active_key_hashes, _sql(request), name)
        await auth.forget(_proxy(request).quotas.redis, hashes)
        return Redirect(f"/admin/teams/{name}?done=saved", status_code=303)

    @get("/keys")
    async def keys_page(self, request: Request) -> Response:
        listed = await _db(keys.list_keys, _sql(request))
        teams = await _db(keys.list_teams, _sql(request))
        return await render.page(
            request,
            "keys.html",
            keys=listed,
            teams=[t.name for t in teams],
            last_used=await _last_used(request, listed),
            revoked=request.query_params.get("revoked", ""),
        )

    @post("/keys")
    async def create_key(self, request: Request) -> Response:
        team = forms.text(await request.form(), "team")
        try:
            new = await _db(keys.create_key, _sql(request), team)
        except keys.ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return await render.page(request, "key_created.html", 201, new=new)

    @post("/keys/{prefix:str}/revoke")
    async def revoke_key(self, request: Request, prefix: FromPath[str]) -> Response:
        try:
            key_hash = await _db(keys.revoke_key, _sql(request), prefix)
        except keys.ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        await auth.forget(_proxy(request).quotas.redis, [key_hash])
        return Redirect(f"/admin/keys?revoked={quote(prefix)}", status_code=303)

    @get("/status")
    async def live_status(self, request: Request) -> Response:
        models, refused = await status.collect(_proxy(request))
        return await render.page(
            request, "status.html", models=models, refused=refused, now=datetime.now(UTC)
        )


def _form_context(request: Request) -> dict[str, Any]:
    return {
        "fields": list(LIMIT_FIELDS),
        "labels": forms.LABELS,
        "catalog": _catalog(request),
        "tiers": TIERS,
    }


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


admin_router = Router(
    path="/admin",
    route_handlers=[SignIn, Admin, TeamUsage],
    before_request=csrf.verify,
    exception_handlers={HTTPException: refuse},
    include_in_schema=False,
)
