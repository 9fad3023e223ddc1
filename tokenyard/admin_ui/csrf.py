"""CSRF protection for every form under /admin.

Three layers: session cookies are SameSite=Strict (a cross-site request carries none); an unsafe
request whose Origin is another site, or that the browser marks cross-site (Sec-Fetch-Site), is
refused; and every form carries a token the server checks. Signed in, the token is the session's
own (synchronizer token); on the sign-in forms, before any session exists, it is a random cookie the
form must repeat (double submit).
"""

import hmac
import secrets

from litestar import Request, Response
from litestar.exceptions import PermissionDeniedException

from tokenyard.admin_ui import sessions

FIELD = "csrf"
ANON_COOKIE = "ty_csrf"
_SAFE = {"GET", "HEAD", "OPTIONS"}


async def token(request: Request) -> str:
    """The token this request's forms must carry (minting the sign-in cookie's if needed)."""
    session = await sessions.load(request)
    if session is not None:
        return session.csrf
    minted = request.cookies.get(ANON_COOKIE) or request.state.get("csrf_minted")
    if not minted:
        minted = request.state.csrf_minted = secrets.token_urlsafe(32)
    return minted


def set_anon_cookie(request: Request, response: Response) -> None:
    """Send the sign-in token's cookie when this request minted it."""
    minted = request.state.get("csrf_minted")
    if minted:
        response.set_cookie(
            ANON_COOKIE,
            minted,
            path=sessions.PATH,
            secure=sessions.secure(request),
            httponly=True,
            samesite="strict",
        )


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


async def verify(request: Request) -> None:
    """before_request hook of every admin route: unsafe methods need a same-site origin and the
    form's token."""
    if request.method in _SAFE:
        return
    if not _same_origin(request):
        raise PermissionDeniedException("cross-site request refused")
    session = await sessions.load(request)
    expected = session.csrf if session is not None else request.cookies.get(ANON_COOKIE)
    given = (await request.form()).get(FIELD)
    if not expected or not isinstance(given, str) or not hmac.compare_digest(given, expected):
        raise PermissionDeniedException("missing or stale form token: reload the page and retry")
