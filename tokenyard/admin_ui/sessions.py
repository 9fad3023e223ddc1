"""Sign-in sessions, kept in Redis so every gateway process shares them.

The cookie holds only a random 256-bit token; Redis keys it by the token's sha256, so reading Redis
does not hand out usable cookies. A sign-in always starts a new token (no session fixation), and
signing out deletes it everywhere at once. An admin session remembers a fingerprint of the sign-in
it was opened with, so changing the admin user or password (or the single sign-on's provider)
ends every session opened before.
"""

import functools
import hashlib
import secrets
from typing import Literal

import msgspec
import redis.asyncio as aioredis
from litestar import Response
from litestar.connection import ASGIConnection

COOKIE = "ty_admin"
PATH = "/admin"


class Session(msgspec.Struct, frozen=True):
    role: Literal["admin", "team"]
    csrf: str  # the token every form of this session carries
    team: str | None = None  # role "team": the one team it may see
    key_hash: str | None = None  # role "team": the key it was opened with; revoked, it ends
    # role "admin": fingerprint() of the sign-in it was opened with (oidc.fingerprint for SSO)
    credential: str | None = None
    user: str | None = None  # role "admin" by single sign-on: the person's verified email


_decoder = msgspec.json.Decoder(Session)


@functools.lru_cache(maxsize=4)
def fingerprint(user: str, password: str) -> str:
    """The admin sign-in's fingerprint: scrypt (about 50 ms, once per process), so a copy of Redis
    is no shortcut to guessing the password."""
    secret = user.encode() + b"\0" + password.encode()
    return hashlib.scrypt(secret, salt=b"tokenyard admin session", n=2**14, r=8, p=1).hex()


def _name(token: str) -> str:
    return "ty:admin-session:" + hashlib.sha256(token.encode()).hexdigest()


def _redis(connection: ASGIConnection) -> aioredis.Redis:
    return connection.app.state.proxy.quotas.redis


async def load(connection: ASGIConnection) -> Session | None:
    """The connection's session, read once per request."""
    if "admin_session" in connection.state:
        return connection.state.admin_session
    session = None
    token = connection.cookies.get(COOKIE)
    if token:
        raw = await _redis(connection).get(_name(token))
        session = _decoder.decode(raw) if raw is not None else None
    connection.state.admin_session = session
    return session


def secure(connection: ASGIConnection) -> bool:
    return connection.url.scheme == "https"


async def start(
    connection: ASGIConnection,
    response: Response,
    role: Literal["admin", "team"],
    ttl_s: float,
    team: str | None = None,
    key_hash: str | None = None,
    credential: str | None = None,
    user: str | None = None,
) -> None:
    """Replace whatever session the browser had with a new one, on a new token."""
    await end(connection, response)
    token = secrets.token_urlsafe(32)
    session = Session(role, secrets.token_urlsafe(32), team, key_hash, credential, user)
    await _redis(connection).set(_name(token), msgspec.json.encode(session), px=int(ttl_s * 1000))
    response.set_cookie(
        COOKIE,
        token,
        max_age=int(ttl_s),
        path=PATH,
        secure=secure(connection),
        httponly=True,
        samesite="strict",
    )


async def end(connection: ASGIConnection, response: Response) -> None:
    token = connection.cookies.get(COOKIE)
    if token:
        await _redis(connection).delete(_name(token))
        response.delete_cookie(COOKIE, path=PATH)
    connection.state.admin_session = None
