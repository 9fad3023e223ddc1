"""Who may see a page of the admin UI: the admin's and a team member's sessions (route guards),
what an anonymous or refused visitor gets instead, and the gateway state the pages read."""

import asyncio
import hmac
from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, NotAuthorizedException
from litestar.handlers import BaseRouteHandler
from litestar.response import Redirect
from sqlalchemy import Engine

from tokenyard.admin_ui import oidc, render, sessions
from tokenyard.admin_ui.oidc import Provider
from tokenyard.core.settings import Settings
from tokenyard.gateway.proxy import Proxy
from tokenyard.tenancy import keys
from tokenyard.tenancy.service import Tenancy


# The pages read the gateway's components here rather than as Litestar dependencies: the guards
# below run before dependencies are resolved, and the pages' helpers all take the request.
def proxy_of(connection: ASGIConnection) -> Proxy:
    return connection.app.state.proxy


def tenancy_of(connection: ASGIConnection) -> Tenancy:
    return connection.app.state.tenancy


def sql_of(connection: ASGIConnection) -> Engine:
    return tenancy_of(connection).sql


def settings_of(connection: ASGIConnection) -> Settings:
    return connection.app.state.settings


def oidc_of(connection: ASGIConnection) -> Provider | None:
    """The single sign-on's identity provider; None where it is off."""
    return connection.app.state.oidc


def actor_of(connection: ASGIConnection) -> str:
    """Who the trail of changes names for the admin's changes: pages that change anything are the
    admin's (admin_only), signed in by single sign-on as a person or with the admin user."""
    session: sessions.Session | None = connection.state.get("admin_session")
    user = session.user if session is not None else None
    return f"admin-ui:{user or settings_of(connection).admin_user}"


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """SQL off the event loop: it also serves completions."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def admin_credential(settings: Settings) -> str:
    # the first call of a process hashes (scrypt): off the event loop
    return await asyncio.to_thread(
        sessions.fingerprint, settings.admin_user, settings.admin_password.get_secret_value()
    )


async def admin_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """The admin's session, opened with the admin user and password this gateway has now, or by
    single sign-on with this provider by someone still on its allow-list."""
    session = await sessions.load(connection)
    settings = settings_of(connection)
    if session is None or session.role != "admin":
        raise NotAuthorizedException("sign in as the platform admin")
    if session.user is not None:
        issuer, client = settings.admin_oidc_issuer, settings.admin_oidc_client_id
        if not issuer or not hmac.compare_digest(
            session.credential or "", oidc.fingerprint(issuer, client)
        ):
            raise NotAuthorizedException("the single sign-on changed: sign in again")
        if not oidc.allowed(session.user, settings.admin_oidc_allow):
            raise NotAuthorizedException(f"{session.user} may no longer sign in as the admin")
        return
    if not settings.admin_password:
        raise NotAuthorizedException("sign in as the platform admin")
    current = await admin_credential(settings)
    if not hmac.compare_digest(session.credential or "", current):
        raise NotAuthorizedException("the admin sign-in changed: sign in again")


async def team_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """A team member's session, while the key it was opened with still works."""
    session = await sessions.load(connection)
    if session is None or session.role != "team" or session.key_hash is None:
        raise NotAuthorizedException("sign in with your team's API key")
    policy = await in_thread(keys.lookup_key, sql_of(connection), session.key_hash)
    if policy is None or policy.team != session.team:
        raise NotAuthorizedException("that key was revoked: sign in with a current key")


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
