"""Single sign-on for the admin UI: OpenID Connect's authorization code flow with PKCE, against the
identity provider the operator configures (TOKENYARD_ADMIN_OIDC_*; docs/admin_ui.md).

A sign-in's nonce and PKCE verifier wait in Redis under its state, so any gateway may receive the
provider's redirect back; a cookie holding the state binds the sign-in to the browser that began it
(no one can finish their own sign-in in someone else's browser). The state is used once. The ID
token is checked before anyone is let in: its signature against the provider's published keys, its
issuer, audience, expiry and nonce. Who may sign in is an allow-list of addresses and @domains that
the guard reads again on every request, so taking someone off it ends their sessions.
"""

import hashlib
import hmac
import secrets
import time
from base64 import urlsafe_b64encode
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import jwt
import msgspec
import redis.asyncio as aioredis

from tokenyard.core.destinations import secure_url

STATE_COOKIE = "ty_sso"
CALLBACK = "/admin/login/sso/callback"
PENDING_S = 600  # a sign-in must come back from the provider within this
# asymmetric algorithms only: a symmetric one would make the client secret a signing key
_ALGORITHMS = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
_CACHE_S = 3600.0  # the discovery document and the keys are kept this long
_REFETCH_S = 60.0  # a token signed by an unknown key refetches the keys at most this often
_LEEWAY_S = 60  # clock skew allowed between the provider and the gateways
_TIMEOUT = httpx.Timeout(10.0)


class SignInRefused(Exception):
    """A sign-in that must not go through; the message is safe to show the browser."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


class _Pending(msgspec.Struct):
    nonce: str
    verifier: str
    next: str
    redirect_uri: str


def allowed(email: str, allow: str) -> bool:
    """Whether `email` is on the allow-list: whole addresses, and @domain for everyone there."""
    email = email.strip().lower()
    _, at, domain = email.rpartition("@")
    if not at or not domain:
        return False
    entries = {e.strip() for e in allow.lower().split(",")}
    return email in entries or "@" + domain in entries


def fingerprint(issuer: str, client_id: str) -> str:
    """What an SSO session remembers of the configuration it was opened under: pointing the
    gateways at another provider or client ends every session opened before."""
    return hashlib.sha256(f"oidc\0{issuer}\0{client_id}".encode()).hexdigest()


def _named(keys: jwt.PyJWKSet, kid: str | None) -> jwt.PyJWK | None:
    """The key `kid`; a token without one may use a provider's only key."""
    if kid is None:
        return keys.keys[0] if len(keys.keys) == 1 else None
    return next((k for k in keys.keys if k.key_id == kid), None)


def _pending_name(state: str) -> str:
    return "ty:admin-sso:" + hashlib.sha256(state.encode()).hexdigest()


class Provider:
    """One identity provider: its discovery document and keys (cached), and the two halves of a
    sign-in. Sign-ins are rare, so each one opens its own HTTP client."""

    def __init__(self, issuer: str, client_id: str, client_secret: str) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self.client_secret = client_secret
        self._document: tuple[float, dict[str, Any]] | None = None
        self._keys: tuple[float, jwt.PyJWKSet] | None = None

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=_TIMEOUT)

    async def _get(self, url: str, **kwargs: Any) -> dict[str, Any]:
        async with self._client() as client:
            answer = await client.get(url, **kwargs)
        answer.raise_for_status()
        data = answer.json()
        if not isinstance(data, dict):
            raise ValueError(f"{url} did not answer a JSON object")
        return data

    async def document(self) -> dict[str, Any]:
        """The provider's discovery document, checked: it names this issuer, and every endpoint
        the gateway sends a secret or trusts a key from is secure."""
        now = time.monotonic()
        if self._document is None or now - self._document[0] > _CACHE_S:
            try:
                doc = await self._get(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
            except (httpx.HTTPError, ValueError) as exc:
                why = f"the identity provider could not be reached: {exc}"
                raise SignInRefused(why, 502) from None
            needed = ("authorization_endpoint", "token_endpoint", "jwks_uri")
            if doc.get("issuer") != self.issuer or not all(
                isinstance(doc.get(name), str) and secure_url(doc[name]) for name in needed
            ):
                why = "the identity provider's discovery document names another issuer, or an "
                raise SignInRefused(why + "endpoint that is not HTTPS", 502)
            self._document = (now, doc)
        return self._document[1]

    async def _fetch_keys(self) -> jwt.PyJWKSet:
        try:
            data = await self._get((await self.document())["jwks_uri"])
            keys = jwt.PyJWKSet.from_dict(data)
        except (httpx.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
            raise SignInRefused(
                f"the identity provider's keys are unreadable: {exc}", 502
            ) from None
        self._keys = (time.monotonic(), keys)
        return keys

    async def _key(self, kid: str | None) -> jwt.PyJWK:
        """The provider's public key `kid` (or its only one). A kid not seen yet fetches the keys
        again, at most once a minute: providers rotate their keys."""
        if self._keys is None or time.monotonic() - self._keys[0] > _CACHE_S:
            await self._fetch_keys()
        assert self._keys is not None
        found = _named(self._keys[1], kid)
        if found is None and time.monotonic() - self._keys[0] > _REFETCH_S:
            found = _named(await self._fetch_keys(), kid)
        if found is None:
            raise SignInRefused(
                "the ID token is signed by a key the identity provider does not publish"
            )
        return found

    async def begin(
        self, redis: aioredis.Redis, next_url: str, redirect_uri: str
    ) -> tuple[str, str]:
        """Start a sign-in: its state (the browser's cookie) and the provider's authorization URL
        to send the browser to."""
        doc = await self.document()
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        pending = _Pending(nonce, verifier, next_url, redirect_uri)
        await redis.set(_pending_name(state), msgspec.json.encode(pending), ex=PENDING_S)
        challenge = urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": redirect_uri,
            "scope": "openid email profile",
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge.decode(),
            "code_challenge_method": "S256",
        }
        endpoint = doc["authorization_endpoint"]
        return state, endpoint + ("&" if "?" in endpoint else "?") + urlencode(query)

    async def finish(
        self, redis: aioredis.Redis, *, state: str, cookie: str, code: str
    ) -> tuple[str, str]:
        """Finish a sign-in the provider sent back: (the person's verified email, where to go)."""
        if not state or not cookie or not hmac.compare_digest(state, cookie):
            raise SignInRefused("this sign-in was not started in this browser: start again", 400)
        raw = await redis.getdel(_pending_name(state))  # once: a replayed redirect finds nothing
        if raw is None:
            raise SignInRefused("this sign-in expired or was already used: start again", 400)
        pending = msgspec.json.decode(raw, type=_Pending)
        tokens = await self._exchange(code, pending)
        claims = await self._verified(tokens.get("id_token"), pending.nonce)
        email = claims.get("email")
        if not isinstance(email, str):
            email = await self._userinfo_email(tokens.get("access_token"), claims["sub"])
        if claims.get("email_verified") in (False, "false"):
            raise SignInRefused(f"{email} is not a verified address at the identity provider", 403)
        return email.strip().lower(), pending.next

    async def _exchange(self, code: str, pending: _Pending) -> dict[str, Any]:
        doc = await self.document()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": pending.redirect_uri,
            "code_verifier": pending.verifier,
            "client_id": self.client_id,
        }
        auth = None
        if self.client_secret:
            methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
            if "client_secret_basic" in methods:  # OAuth 2 form-encodes both parts first
                auth = httpx.BasicAuth(quote(self.client_id, ""), quote(self.client_secret, ""))
            else:
                form["client_secret"] = self.client_secret
        try:
            async with self._client() as client:
                answer = await client.post(doc["token_endpoint"], data=form, auth=auth)
            tokens = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            tokens = None
        if not isinstance(tokens, dict):
            raise SignInRefused("the identity provider did not accept this sign-in: start again")
        return tokens

    async def _verified(self, id_token: Any, nonce: str) -> dict[str, Any]:
        if not isinstance(id_token, str):
            raise SignInRefused("the identity provider sent no ID token")
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError:
            raise SignInRefused("the ID token is malformed") from None
        algorithm = header.get("alg")
        if algorithm not in _ALGORITHMS:
            raise SignInRefused(f"the ID token's algorithm {algorithm!r} is not accepted")
        key = await self._key(header.get("kid"))
        try:
            claims = jwt.decode(
                id_token,
                key.key,
                algorithms=[algorithm],
                audience=self.client_id,
                issuer=self.issuer,
                leeway=_LEEWAY_S,
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise SignInRefused(f"the ID token was refused: {exc}") from None
        if not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
            raise SignInRefused("the ID token was not issued for this sign-in (nonce)")
        if claims.get("azp", self.client_id) != self.client_id:
            raise SignInRefused("the ID token was issued to another client (azp)")
        return claims

    async def _userinfo_email(self, access_token: Any, subject: str) -> str:
        """The email of a provider that keeps it out of the ID token, from its userinfo endpoint
        (for the same subject)."""
        endpoint = (await self.document()).get("userinfo_endpoint")
        if not isinstance(access_token, str) or not isinstance(endpoint, str):
            raise SignInRefused("the identity provider gave no email address: ask for scope email")
        if not secure_url(endpoint):
            raise SignInRefused("the identity provider's userinfo endpoint is not HTTPS", 502)
        try:
            info = await self._get(endpoint, headers={"authorization": f"Bearer {access_token}"})
        except (httpx.HTTPError, ValueError):
            raise SignInRefused("the identity provider's userinfo endpoint failed", 502) from None
        if info.get("sub") != subject or not isinstance(info.get("email"), str):
            raise SignInRefused("the identity provider gave no email address for this sign-in")
        if info.get("email_verified") in (False, "false"):
            raise SignInRefused(f"{info['email']} is not a verified address", 403)
        return info["email"]
