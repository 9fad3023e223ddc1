"""Single sign-on to the admin UI (OpenID Connect), against a provider on loopback that speaks the
protocol (tests/admin_ui/fake_idp.py): who is on the allow-list gets an admin session and is named
in the trail of changes; everyone else, a forged or spoiled ID token, a sign-in finished in
another browser and a replayed redirect get none."""

import random
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from tests.admin_ui.conftest import CHROMIUM, csrf_of
from tests.admin_ui.fake_idp import CLIENT_ID, CLIENT_SECRET, Provider, identity_provider
from tests.gateway.conftest import Gateway
from tokenyard.admin_ui import oidc, throttle
from tokenyard.core.destinations import secure_url
from tokenyard.core.settings import Settings

ALLOW = "alice@example.com, @corp.example"


@pytest.fixture(scope="module")
def idp() -> Iterator[Provider]:
    with identity_provider() as provider:
        yield provider


def _sso_env(base_env: dict[str, str], idp: Provider, allow: str = ALLOW) -> dict[str, str]:
    return base_env | {
        "TOKENYARD_ADMIN_OIDC_ISSUER": idp.url,
        "TOKENYARD_ADMIN_OIDC_CLIENT_ID": CLIENT_ID,
        "TOKENYARD_ADMIN_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "TOKENYARD_ADMIN_OIDC_ALLOW": allow,
        "TOKENYARD_ADMIN_OIDC_NAME": "Example SSO",
    }


@pytest.fixture(scope="module")
def sso_gateway(base_env: dict[str, str], idp: Provider, data_dir: Path) -> Iterator[Gateway]:
    """A gateway whose admins sign in only by single sign-on (no admin password)."""
    gw = Gateway(_sso_env(base_env, idp), data_dir / "sso-gateway.log")
    yield gw
    gw.stop()


@pytest.fixture(autouse=True)
def _fresh_provider(idp: Provider) -> None:
    idp.who = {"sub": "u-1", "email": "alice@example.com", "email_verified": True}
    idp.tamper = ""
    idp.consent = False


def browser(gateway: Gateway) -> httpx.Client:
    """A browser of its own: its cookies, and a client address of its own (forwarded by the
    trusted proxy) so that its sign-ins count against no other test's allowance."""
    forwarded = {"x-forwarded-for": f"2001:db8::{random.getrandbits(64):x}"}
    return httpx.Client(base_url=gateway.url, headers=forwarded)


def to_provider(client: httpx.Client, next_path: str = "/admin/teams") -> str:
    """Start a sign-in; the provider signs in its `who` and answers its redirect back."""
    start = client.get("/admin/login/sso", params={"next": next_path})
    assert start.status_code == 303, start.text
    authorize = start.headers["location"]
    assert "code_challenge=" in authorize and "client_id=" + CLIENT_ID in authorize
    back = httpx.get(authorize)
    assert back.status_code == 302, back.text
    return back.headers["location"]


def sign_in(client: httpx.Client, next_path: str = "/admin/teams") -> httpx.Response:
    return client.get(to_provider(client, next_path))


def test_a_person_on_the_allow_list_signs_in_and_is_named_in_the_trail(
    sso_gateway: Gateway, idp: Provider
) -> None:
    login = httpx.get(sso_gateway.url + "/admin/login")
    assert "Sign in with Example SSO" in login.text
    assert 'name="password"' not in login.text  # no admin password on this gateway
    with browser(sso_gateway) as client:
        done = sign_in(client, "/admin/teams")
        assert done.status_code == 200, done.text
        assert 'http-equiv="refresh" content="0; url=/admin/teams"' in done.text
        assert "alice@example.com" in done.text
        (cookie,) = [c for c in done.headers.get_list("set-cookie") if c.startswith("ty_admin=")]
        assert "samesite=strict" in cookie.lower() and "httponly" in cookie.lower()
        assert client.get("/admin/teams").status_code == 200
        name = "sso" + uuid.uuid4().hex[:8]
        form = {"name": name, "default_tier": "interactive"}
        made = client.post(
            "/admin/teams", data=form | {"csrf": csrf_of(client.get("/admin/teams"))}
        )
        assert made.status_code == 303, made.text
        trail = client.get("/admin/changes", params={"team": name})
        assert "admin-ui:alice@example.com" in trail.text
        # signing out ends the session
        client.post("/admin/logout", data={"csrf": csrf_of(client.get("/admin/teams"))})
        assert client.get("/admin/teams").status_code == 303


def test_an_allowed_domain_signs_in_and_other_people_do_not(
    sso_gateway: Gateway, idp: Provider
) -> None:
    idp.who = {"sub": "u-2", "email": "Bob@Corp.Example", "email_verified": True}
    with browser(sso_gateway) as client:
        assert sign_in(client).status_code == 200
        assert client.get("/admin/usage").status_code == 200
    for who in (
        {"sub": "u-3", "email": "eve@example.com"},  # the domain of an address, not listed
        {"sub": "u-4", "email": "mallory@corp.example.evil.test"},
        {"sub": "u-5", "email": "carol@corp.example", "email_verified": False},
    ):
        idp.who = who
        with browser(sso_gateway) as client:
            refused = sign_in(client)
            assert refused.status_code == 403, (who, refused.text)
            assert "ty_admin" not in client.cookies
            assert client.get("/admin/teams").status_code == 303  # still anonymous


def test_the_email_may_come_from_userinfo(sso_gateway: Gateway, idp: Provider) -> None:
    """A provider that keeps the address out of the ID token: the gateway asks userinfo."""
    idp.who = {"sub": "u-6", "userinfo_email": "dave@corp.example"}
    with browser(sso_gateway) as client:
        done = sign_in(client)
        assert done.status_code == 200 and "dave@corp.example" in done.text


@pytest.mark.parametrize(
    "tamper", ["foreign key", "audience", "issuer", "expired", "nonce", "hmac", "unsigned"]
)
def test_a_forged_or_spoiled_id_token_opens_no_session(
    sso_gateway: Gateway, idp: Provider, tamper: str
) -> None:
    idp.tamper = tamper
    with browser(sso_gateway) as client:
        refused = sign_in(client)
        assert refused.status_code == 401, refused.text
        assert "ty_admin" not in client.cookies
        assert client.get("/admin/usage").status_code == 303


def test_a_sign_in_is_bound_to_its_browser_and_used_once(
    sso_gateway: Gateway, idp: Provider
) -> None:
    with browser(sso_gateway) as victim, browser(sso_gateway) as attacker:
        back = to_provider(attacker)  # the attacker's own sign-in, finished in the victim's browser
        before = idp.token_requests
        planted = victim.get(back)
        assert planted.status_code == 400 and "not started in this browser" in planted.text
        assert idp.token_requests == before  # refused before the code was exchanged
        assert "ty_admin" not in victim.cookies
        state = attacker.cookies["ty_sso"]
        assert attacker.get(back).status_code == 200  # its own browser finishes it
        # the same redirect replayed, its state cookie with it
        again = httpx.get(back, headers={**attacker.headers, "cookie": f"ty_sso={state}"})
        assert again.status_code == 400 and "already used" in again.text
    with browser(sso_gateway) as client:
        declined = client.get(
            "/admin/login/sso/callback", params={"error": "access_denied", "state": "x"}
        )
        assert declined.status_code == 401 and "access_denied" in declined.text


def test_taking_someone_off_the_list_ends_their_sessions(
    sso_gateway: Gateway, idp: Provider, base_env: dict[str, str], data_dir: Path
) -> None:
    """Sessions live in Redis, shared by every gateway: one whose allow-list no longer names
    alice refuses her session at once, while the first gateway still takes it."""
    with browser(sso_gateway) as client:
        assert sign_in(client).status_code == 200
        narrowed = Gateway(_sso_env(base_env, idp, "@corp.example"), data_dir / "sso-2.log")
        try:
            with httpx.Client(base_url=narrowed.url, cookies=client.cookies) as elsewhere:
                assert elsewhere.get("/admin/teams").status_code == 303
            assert client.get("/admin/teams").status_code == 200
        finally:
            narrowed.stop()


def test_without_a_provider_single_sign_on_is_off(admin_gateway: Gateway) -> None:
    assert "Sign in with" not in httpx.get(admin_gateway.url + "/admin/login").text
    for path in ("/admin/login/sso", "/admin/login/sso/callback?code=x&state=y"):
        answer = httpx.get(admin_gateway.url + path)
        assert answer.status_code == 404 and "single sign-on is off" in answer.text
        assert "ty_admin=" not in answer.headers.get("set-cookie", "")


def test_starts_count_against_the_sign_in_allowance(sso_gateway: Gateway, idp: Provider) -> None:
    """Each start waits in Redis, so an anonymous client may leave only so many unfinished; a
    finished sign-in gives its start back."""
    with browser(sso_gateway) as client:
        for _ in range(throttle.LIMIT + 2):
            assert sign_in(client).status_code == 200
        starts = [client.get("/admin/login/sso").status_code for _ in range(throttle.LIMIT + 1)]
        assert starts == [303] * throttle.LIMIT + [429]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ADMIN_OIDC_ISSUER": "https://idp.example.com"}, "CLIENT_ID"),
        ({"ADMIN_OIDC_ISSUER": "https://idp.example.com", "ADMIN_OIDC_CLIENT_ID": "x"}, "ALLOW"),
        (
            {
                "ADMIN_OIDC_ISSUER": "http://idp.example.com",
                "ADMIN_OIDC_CLIENT_ID": "x",
                "ADMIN_OIDC_ALLOW": "@example.com",
            },
            "HTTPS",
        ),
    ],
)
def test_single_sign_on_settings_are_checked_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv("TOKENYARD_" + name, value)
    with pytest.raises(ValidationError, match=message):
        Settings()


def test_allow_list_and_secure_urls() -> None:
    assert oidc.allowed("Alice@Example.com ", "alice@example.com")
    assert oidc.allowed("x@corp.example", "a@b.c, @corp.example")
    assert not oidc.allowed("x@sub.corp.example", "@corp.example")
    assert not oidc.allowed("corp.example", "@corp.example") and not oidc.allowed("x@", "@")
    assert secure_url("https://idp.example.com") and secure_url("http://127.0.0.1:9")
    assert secure_url("http://localhost:9") and secure_url("http://[::1]:9/x")
    assert not secure_url("http://idp.example.com") and not secure_url("ftp://x")


def test_single_sign_on_in_a_browser(sso_gateway: Gateway, idp: Provider) -> None:
    """In Chromium, with the provider on another site than the gateway (127.0.0.1 against
    localhost) and a page there the person approves on: the state cookie comes back on the
    provider's cross-site redirect, and the strict session cookie is sent on the page the sign-in
    moves on to (a redirect the provider's page began would go without it)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    site = sso_gateway.url.replace("127.0.0.1", "localhost")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = chromium.new_page()
            page.goto(site + "/admin/teams")
            sync_api.expect(page).to_have_url(site + "/admin/login?next=/admin/teams")
            idp.consent = True
            page.click("text=Sign in with Example SSO")
            sync_api.expect(page).to_have_url(re.compile(re.escape(idp.url) + "/authorize"))
            page.click("text=Approve")
            sync_api.expect(page).to_have_url(site + "/admin/teams")
            sync_api.expect(page.get_by_role("button", name="Sign out")).to_be_visible()
            sync_api.expect(page.locator("main")).to_contain_text("Create")
        finally:
            chromium.close()
