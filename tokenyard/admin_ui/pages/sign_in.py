"""The only routes open to anonymous visitors: the sign-in forms (throttled per client), single
sign-on's two legs (admin_ui/oidc.py), sign-out and the stylesheet."""

import hmac
from hashlib import sha256
from pathlib import Path

from litestar import Controller, Request, Response, get, post
from litestar.response import Redirect

from tokenyard.admin_ui import forms, oidc, render, sessions, throttle
from tokenyard.admin_ui.access import admin_credential, oidc_of, proxy_of, settings_of
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
    settings = settings_of(request)
    password, sso = bool(settings.admin_password), settings.admin_oidc_issuer != ""
    return await render.page(
        request,
        "login.html",
        status,
        kind=kind,
        error=error,
        off=kind == "admin" and not (password or sso),
        password=password,
        sso=settings.admin_oidc_name if sso else "",
        next=_local_next(request.query_params.get("next"), ""),
    )


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

    @get("/login/sso")
    async def sso_begin(self, request: Request) -> Response:
        """Send the browser to the identity provider, a cookie binding the sign-in to it."""
        provider = oidc_of(request)
        if provider is None:
            return await _login_page(request, "admin", 404, "single sign-on is off")
        if not await _admitted(request):  # each start waits in Redis: given back once finished
            return await _login_page(request, "admin", 429, _THROTTLED)
        settings = settings_of(request)
        own = f"{request.url.scheme}://{request.url.netloc}{oidc.CALLBACK}"
        next_url = _local_next(request.query_params.get("next"), "/admin/usage")
        try:
            state, url = await provider.begin(
                proxy_of(request).quotas.redis, next_url, settings.admin_oidc_redirect_url or own
            )
        except oidc.SignInRefused as exc:
            return await _login_page(request, "admin", exc.status, str(exc))
        response = Redirect(url, status_code=303)
        response.set_cookie(
            oidc.STATE_COOKIE,
            state,
            max_age=oidc.PENDING_S,
            path=oidc.CALLBACK,
            secure=sessions.secure(request),
            httponly=True,
            samesite="lax",  # the provider's redirect back is a cross-site navigation
        )
        return response

    @get("/login/sso/callback")
    async def sso_finish(self, request: Request) -> Response:
        """The provider's redirect back: the code exchanged and its ID token checked, an admin
        session for someone on the allow-list."""
        provider = oidc_of(request)
        if provider is None:
            return await _login_page(request, "admin", 404, "single sign-on is off")
        settings, query = settings_of(request), request.query_params
        try:
            if "error" in query:  # the person declined, or the provider refused
                why = f"{query['error']} {query.get('error_description', '')}".strip()[:200]
                raise oidc.SignInRefused(f"the identity provider did not sign you in: {why}")
            email, next_url = await provider.finish(
                proxy_of(request).quotas.redis,
                state=query.get("state", ""),
                cookie=request.cookies.get(oidc.STATE_COOKIE, ""),
                code=query.get("code", ""),
            )
            if not oidc.allowed(email, settings.admin_oidc_allow):
                raise oidc.SignInRefused(f"{email} may not sign in as the platform admin", 403)
        except oidc.SignInRefused as exc:
            response = await _login_page(request, "admin", exc.status, str(exc))
            response.delete_cookie(oidc.STATE_COOKIE, path=oidc.CALLBACK)
            return response
        await _succeeded(request)
        # a page that moves on by itself rather than a redirect: the session cookie is
        # SameSite=Strict, and a browser keeps it off a redirect chain the provider began
        response = await render.page(request, "signed_in.html", user=email, next=next_url)
        response.delete_cookie(oidc.STATE_COOKIE, path=oidc.CALLBACK)
        await sessions.start(
            request,
            response,
            "admin",
            settings.admin_session_s,
            credential=oidc.fingerprint(settings.admin_oidc_issuer, settings.admin_oidc_client_id),
            user=email,
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
