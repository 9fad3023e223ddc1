"""The only routes open to anonymous visitors: the sign-in forms (throttled per client), sign-out
and the stylesheet."""

import hmac
from hashlib import sha256
from pathlib import Path

from litestar import Controller, Request, Response, get, post
from litestar.response import Redirect

from tokenyard.admin_ui import forms, render, sessions, throttle
from tokenyard.admin_ui.access import admin_credential, proxy_of, settings_of
from tokenyard.core.errors import GatewayError
from tokenyard.tenancy import keys

_CSS = (Path(__file__).parent.parent / "static" / "admin.css").read_bytes()


def _local_next(raw: str | None, default: str) -> str:
    """Where to go after signing in: only a path of this UI, never another site."""
    if raw and raw.startswith("/admin") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return default


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _admitted(request: Request) -> bool:
    return await throttle.admit(proxy_of(request).quotas.redis, _client(request))


async def _succeeded(request: Request) -> None:
    await throttle.succeeded(proxy_of(request).quotas.redis, _client(request))


def _same(given: str, expected: str) -> bool:
    # digests: equal lengths, so the comparison's time says nothing about the length either
    return hmac.compare_digest(sha256(given.encode()).digest(), sha256(expected.encode()).digest())


_THROTTLED = "too many failed sign-ins: wait a few minutes"


async def _login_page(request: Request, kind: str, status: int = 200, error: str = "") -> Response:
    off = kind == "admin" and not settings_of(request).admin_password
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
        settings = settings_of(request)
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
            credential=await admin_credential(settings),
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
            policy = await proxy_of(request).auth.authenticate(
                f"Bearer {key}", path=request.scope["path"]
            )
        except GatewayError:
            return await _login_page(request, "team", 401, "that key is not valid (or was revoked)")
        await _succeeded(request)
        response = Redirect("/admin/team-usage", status_code=303)
        await sessions.start(
            request,
            response,
            "team",
            settings_of(request).admin_session_s,
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
