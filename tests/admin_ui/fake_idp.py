"""An OpenID Connect identity provider on loopback for tests, speaking the protocol as a real one
does: discovery, an authorization endpoint that signs in whoever the test names (no login form),
a token endpoint that checks the client's secret, the redirect URI and PKCE, and uses each code
once, RS256 ID tokens whose keys it publishes, and userinfo.

`Provider.who` is the next person's claims; `Provider.tamper` spoils the next ID token one way, as
an attacker or a broken provider would; `Provider.consent` makes the authorization endpoint show a
page whose form the person submits, as a real provider's sign-in page is (the redirect back is then
a navigation the provider's site began)."""

import base64
import hashlib
import html
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

import jwt
import msgspec
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.loopback_server import serving

CLIENT_ID = "tokenyard-admin"
CLIENT_SECRET = "s3cret/with+chars=" + secrets.token_hex(16)  # form-encoded in Basic auth
KID = "key-1"


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Provider:
    def __init__(self) -> None:
        self.url = ""
        self.key, self.foreign_key = _rsa(), _rsa()  # the published key, and one never published
        self.who: dict[str, Any] = {"sub": "u-1", "email": "alice@example.com"}
        self.tamper = ""
        self.consent = False
        self.codes: dict[str, dict[str, Any]] = {}
        self.access: dict[str, dict[str, Any]] = {}
        self.token_requests = 0

    def id_token(self, grant: dict[str, Any]) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": CLIENT_ID,
            "iat": now,
            "exp": now + 300,
            "nonce": grant["nonce"],
            **{k: v for k, v in grant["who"].items() if not k.startswith("userinfo_")},
        }
        key, algorithm, headers = self.key, "RS256", {"kid": KID}
        match grant["tamper"]:
            case "foreign key":  # the right kid, signed by a key the provider never published
                key = self.foreign_key
            case "audience":
                claims["aud"] = "another-client"
            case "issuer":
                claims["iss"] = "https://idp.example.net"
            case "expired":
                claims["iat"], claims["exp"] = now - 7200, now - 3600
            case "nonce":
                claims["nonce"] = "not-this-sign-in"
            case "hmac":  # signed with the client secret (the algorithm-confusion attack)
                key, algorithm = CLIENT_SECRET.encode(), "HS256"
            case "unsigned":
                key, algorithm = None, "none"
        return jwt.encode(claims, key, algorithm=algorithm, headers=headers)  # type: ignore[arg-type]


@contextmanager
def identity_provider() -> Iterator[Provider]:
    provider = Provider()

    class Handler(BaseHTTPRequestHandler):
        def _answer(
            self, status: int, body: Any = None, headers: dict[str, str] | None = None
        ) -> None:
            raw = msgspec.json.encode(body) if body is not None else b""
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/.well-known/openid-configuration":
                base = provider.url
                self._answer(
                    200,
                    {
                        "issuer": base,
                        "authorization_endpoint": base + "/authorize",
                        "token_endpoint": base + "/token",
                        "jwks_uri": base + "/jwks",
                        "userinfo_endpoint": base + "/userinfo",
                        "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                        "code_challenge_methods_supported": ["S256"],
                    },
                )
            elif path == "/jwks":
                public = jwt.algorithms.RSAAlgorithm.to_jwk(provider.key.public_key(), as_dict=True)
                self._answer(200, {"keys": [{**public, "kid": KID, "use": "sig", "alg": "RS256"}]})
            elif path == "/authorize" and provider.consent:
                form = (
                    '<form method="post" action="/approve">'
                    f'<input type="hidden" name="query" value="{html.escape(query)}">'
                    "<button>Approve</button></form>"
                )
                self._page(form)
            elif path == "/authorize":
                self._approve(query)
            elif path == "/userinfo":
                grant = provider.access.get(self.headers.get("authorization", "")[7:])
                if grant is None:
                    return self._answer(401, {"error": "invalid_token"})
                who = grant["who"]
                info = {"sub": who["sub"]} | {
                    k.removeprefix("userinfo_"): v
                    for k, v in who.items()
                    if k.startswith("userinfo_")
                }
                self._answer(200, info)
            else:
                self._answer(404, {"error": "not_found"})

        def _page(self, body: str) -> None:
            raw = f"<!doctype html><html><body>{body}</body></html>".encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _approve(self, query: str) -> None:
            """Sign in `who` and send the browser back with a code."""
            ask = dict(parse_qsl(query))
            assert ask["response_type"] == "code" and ask["client_id"] == CLIENT_ID, ask
            assert "openid" in ask["scope"].split() and ask["code_challenge_method"] == "S256"
            code = secrets.token_urlsafe(16)
            provider.codes[code] = {**ask, "who": dict(provider.who), "tamper": provider.tamper}
            back = ask["redirect_uri"] + "?" + urlencode({"code": code, "state": ask["state"]})
            self._answer(302, headers={"location": back})

        def do_POST(self) -> None:
            form = dict(parse_qsl(self.rfile.read(int(self.headers["content-length"])).decode()))
            if self.path == "/approve":
                return self._approve(form["query"])
            if self.path != "/token":
                return self._answer(404, {"error": "not_found"})
            provider.token_requests += 1
            scheme, _, encoded = self.headers.get("authorization", "").partition(" ")
            user, _, secret = base64.b64decode(encoded).decode().partition(":") if encoded else "::"
            if scheme != "Basic" or (unquote(user), unquote(secret)) != (CLIENT_ID, CLIENT_SECRET):
                return self._answer(401, {"error": "invalid_client"})
            grant = provider.codes.pop(form.get("code", ""), None)  # a code is good once
            verifier = form.get("code_verifier", "").encode()
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=")
            if (
                grant is None
                or form.get("grant_type") != "authorization_code"
                or form.get("redirect_uri") != grant["redirect_uri"]
                or challenge.decode() != grant["code_challenge"]
            ):
                return self._answer(400, {"error": "invalid_grant"})
            access = secrets.token_urlsafe(16)
            provider.access[access] = grant
            tokens = {"access_token": access, "token_type": "Bearer", "expires_in": 300}
            self._answer(200, tokens | {"id_token": provider.id_token(grant)})

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as port:
        provider.url = f"http://127.0.0.1:{port}"
        yield provider
