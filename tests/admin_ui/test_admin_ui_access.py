"""Who may do what under /admin, against a real gateway: anonymous visitors are sent to sign in or
refused, forms without the session's token or from another site are refused, a team member sees
only their own team, and an admin's quota change reaches another gateway process within a second."""

import asyncio
import random
import re
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import msgspec
import openai
import pytest
import redis as redis_sync
from sqlmodel import Session

from tests.admin_ui.conftest import ADMIN_PASSWORD, ADMIN_USER, csrf_of, sign_in
from tests.billing.conftest import event
from tests.gateway.conftest import MODEL, Gateway, wait_until
from tokenyard.admin_ui import throttle
from tokenyard.app import create_app
from tokenyard.billing import store
from tokenyard.billing.events import decoder, to_row
from tokenyard.billing.models import BudgetAlert, UsageDaily
from tokenyard.gateway.quotas import TeamKeys, day_number
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.models import TeamEvent

PUBLIC = {
    "/admin/login",
    "/admin/login/sso",  # single sign-on's two legs (tests/admin_ui/test_admin_ui_sso.py)
    "/admin/login/sso/callback",
    "/admin/team-usage/login",
    "/admin/static/admin.css",
}
CHAT = [{"role": "user", "content": "one two three #chunks=3"}]


def _admin_routes() -> list[tuple[str, str]]:
    """(method, path) of every route under /admin but the sign-in forms and the stylesheet."""
    found = []
    for route in create_app().routes:
        if not route.path.startswith("/admin") or route.path in PUBLIC:
            continue
        path = (
            route.path.replace("{name:str}", "someteam")
            .replace("{prefix:str}", "ty-abc")
            .replace("{event_id:str}", "evt_abc")
        )
        found += [(m, path) for m in sorted(route.methods - {"HEAD", "OPTIONS"})]
    return found


def test_the_route_list_covers_the_pages() -> None:
    paths = {p for _, p in _admin_routes()}
    assert {
        "/admin/usage",
        "/admin/teams",
        "/admin/keys",
        "/admin/status",
        "/admin/changes",
        "/admin/alerts",
        "/admin/webhooks",
        "/admin/requests",
        "/admin/team-usage",
    } <= paths


@pytest.mark.parametrize(("method", "path"), _admin_routes())
def test_anonymous_requests_are_refused(admin_gateway: Gateway, method: str, path: str) -> None:
    answer = httpx.request(method, admin_gateway.url + path, data={"csrf": "x"})
    if path == "/admin/logout":  # signing out needs no session, but still a valid form token
        assert answer.status_code == 403
    elif method == "GET":
        assert answer.status_code == 303
        assert answer.headers["location"].split("?")[0] in PUBLIC
    else:
        assert answer.status_code == 401
    assert "ty_admin=" not in answer.headers.get("set-cookie", "")


def test_failed_sign_ins_are_limited_per_client_behind_a_trusted_proxy(
    admin_gateway: Gateway,
) -> None:
    """The test client is the gateway's trusted proxy (127.0.0.1 by default): each forwarded
    client address has its own failure count, so one guesser does not lock everyone out."""

    def attempt(client_ip: str) -> int:
        headers = {"x-forwarded-for": client_ip}
        with httpx.Client(base_url=admin_gateway.url, headers=headers) as client:
            token = csrf_of(client.get("/admin/login"))
            data = {"user": ADMIN_USER, "password": "nope", "csrf": token}
            return client.post("/admin/login", data=data).status_code

    guesser, bystander = (f"203.0.113.{n}" for n in random.sample(range(1, 255), 2))
    assert [attempt(guesser) for _ in range(10)] == [401] * 10
    assert attempt(guesser) == 429
    assert attempt(bystander) == 401


def _unique_client() -> dict[str, str]:
    """Headers that make the test a client address of its own (forwarded by the trusted proxy)."""
    return {"x-forwarded-for": f"2001:db8::{random.getrandbits(64):x}"}


def test_parallel_guesses_are_compared_at_most_the_limit(admin_gateway: Gateway) -> None:
    """Each attempt is counted before its password is compared: of 50 guesses sent at once,
    exactly the limit are compared (401), the rest refused unseen (429)."""
    headers = _unique_client()
    with httpx.Client(base_url=admin_gateway.url, headers=headers) as client:
        data = {"user": ADMIN_USER, "password": "nope", "csrf": csrf_of(client.get("/admin/login"))}
        cookies = dict(client.cookies)

    async def guess_at_once(n: int) -> list[int]:
        async with httpx.AsyncClient(
            base_url=admin_gateway.url,
            headers=headers,
            cookies=cookies,
            limits=httpx.Limits(max_connections=n),
        ) as client:
            answers = await asyncio.gather(
                *(client.post("/admin/login", data=data) for _ in range(n))
            )
        return [a.status_code for a in answers]

    statuses = asyncio.run(guess_at_once(50))
    assert sorted(statuses) == [401] * throttle.LIMIT + [429] * (50 - throttle.LIMIT)


def test_successful_sign_ins_use_no_allowance(admin_gateway: Gateway, team: Any) -> None:
    _, key = team()
    with httpx.Client(base_url=admin_gateway.url, headers=_unique_client()) as client:

        def attempt(path: str, **fields: str) -> int:
            token = csrf_of(client.get(path))  # the form's, or the session's once signed in
            return client.post(path, data={"csrf": token, **fields}).status_code

        right = {"user": ADMIN_USER, "password": ADMIN_PASSWORD}
        wrong = {"user": ADMIN_USER, "password": "nope"}
        for _ in range(throttle.LIMIT + 2):
            assert attempt("/admin/login", **right) == 303
            assert attempt("/admin/team-usage/login", key=key) == 303
        failures = [attempt("/admin/login", **wrong) for _ in range(throttle.LIMIT)]
        assert failures == [401] * throttle.LIMIT
        # the allowance is shared by both forms, and a valid key does not reset it
        assert attempt("/admin/team-usage/login", key=key) == 429
        assert attempt("/admin/login", **right) == 429


def test_wrong_password_is_refused_and_opens_no_session(admin_gateway: Gateway) -> None:
    with httpx.Client(base_url=admin_gateway.url) as client:
        token = csrf_of(client.get("/admin/login"))
        answer = client.post(
            "/admin/login", data={"user": ADMIN_USER, "password": "nope", "csrf": token}
        )
        assert answer.status_code == 401
        assert "wrong user name or password" in answer.text
        assert "ty_admin" not in client.cookies
        assert client.get("/admin/teams").status_code == 303  # still anonymous


def test_sign_in_sets_a_strict_http_only_cookie_and_sign_out_ends_it(
    admin_gateway: Gateway,
) -> None:
    with httpx.Client(base_url=admin_gateway.url) as client:
        token = csrf_of(client.get("/admin/login"))
        answer = client.post(
            "/admin/login", data={"user": ADMIN_USER, "password": ADMIN_PASSWORD, "csrf": token}
        )
        cookie = answer.headers["set-cookie"].lower()
        assert "ty_admin=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
        page = client.get("/admin/teams")
        assert page.status_code == 200
        stolen = dict(client.cookies)
        assert client.post("/admin/logout", data={"csrf": csrf_of(page)}).status_code == 303
    # the old cookie is dead on the server, not just deleted from the browser
    assert httpx.get(admin_gateway.url + "/admin/teams", cookies=stolen).status_code == 303


def test_a_password_change_ends_the_admin_sessions_opened_before(
    admin: httpx.Client, start_gateway: Any
) -> None:
    """Gateways share sessions through Redis; one started with a new admin password refuses the
    cookies opened with the old one, while one with the same sign-in still takes them."""
    cookies = dict(admin.cookies)
    same = start_gateway(admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD)
    assert httpx.get(same.url + "/admin/teams", cookies=cookies).status_code == 200
    new_password = "pw-" + uuid.uuid4().hex
    changed = start_gateway(admin_user=ADMIN_USER, admin_password=new_password)
    refused = httpx.get(changed.url + "/admin/teams", cookies=cookies)
    assert refused.status_code == 303
    assert refused.headers["location"].startswith("/admin/login?")
    fresh = sign_in(changed.url, password=new_password)
    assert fresh.get("/admin/teams").status_code == 200
    fresh.close()


def test_odd_input_is_refused_or_ignored_never_a_500(
    admin_gateway: Gateway, admin: httpx.Client
) -> None:
    """Files where text fields belong (a multipart form), a team name that would break the CSV's
    header, a date the default range cannot be counted back from."""
    with httpx.Client(base_url=admin_gateway.url, headers=_unique_client()) as anonymous:
        token = csrf_of(anonymous.get("/admin/login"))
        files = {"user": ("u", b"owner"), "password": ("p", b"x")}
        assert anonymous.post("/admin/login", data={"csrf": token}, files=files).status_code == 401
        files = {"key": ("k", b"ty-x")}
        answer = anonymous.post("/admin/team-usage/login", data={"csrf": token}, files=files)
        assert answer.status_code == 401
    token = csrf_of(admin.get("/admin/teams"))
    files = {"name": ("n", b"x")}
    assert admin.post("/admin/teams", data={"csrf": token}, files=files).status_code == 400
    csv = admin.get("/admin/usage.csv", params={"team": 'a"\r\nset-cookie: x=1'})
    assert csv.status_code == 200 and "set-cookie" not in csv.headers
    assert csv.headers["content-disposition"].endswith(f'-{datetime.now(UTC).date()}.csv"')
    page = admin.get("/admin/usage", params={"end": "0001-01-01"})
    assert page.status_code == 200 and "is not a date" in page.text


def _team_form(name: str, **fields: str) -> dict[str, Any]:
    return {"name": name, "default_tier": "interactive", **fields}


@pytest.mark.parametrize(
    "headers",
    [{}, {"origin": "https://evil.example"}, {"sec-fetch-site": "cross-site"}],
    ids=["no-token", "foreign-origin", "cross-site"],
)
def test_forms_without_the_token_or_from_another_site_are_refused(
    admin: httpx.Client, headers: dict[str, str]
) -> None:
    name = "csrf" + uuid.uuid4().hex[:8]
    token = csrf_of(admin.get("/admin/teams"))
    data = _team_form(name)
    if headers:
        data["csrf"] = token  # the right token, from the wrong site
    answer = admin.post("/admin/teams", data=data, headers=headers)
    assert answer.status_code == 403
    assert admin.get(f"/admin/teams/{name}").status_code == 404  # nothing was created
    # the same form, same site, with the token: accepted
    data["csrf"] = token
    assert admin.post("/admin/teams", data=data).status_code == 303
    assert admin.get(f"/admin/teams/{name}").status_code == 200


def test_invalid_quotas_are_explained_next_to_their_fields(admin: httpx.Client) -> None:
    name = "val" + uuid.uuid4().hex[:8]
    token = csrf_of(admin.get("/admin/teams"))
    data = _team_form(
        name, tpm="-5", usd_per_day="ten", auto_threshold="2", models="gpt-nope", csrf=token
    )
    answer = admin.post("/admin/teams", data=data)
    assert answer.status_code == 400
    assert 'id="e-tpm">Tokens per minute must be 0 or more' in answer.text
    assert 'id="e-usd_per_day">Dollars per day must be a number' in answer.text
    assert 'id="e-auto_threshold">Auto-routing threshold must be between 0 and 1' in answer.text
    assert 'id="e-models">Allowed models not in the catalog: gpt-nope' in answer.text
    assert 'value="-5"' in answer.text  # the typed value is kept for correcting
    assert admin.get(f"/admin/teams/{name}").status_code == 404


def _usage_row(team: str, tokens: int, model: str = MODEL) -> UsageDaily:
    return UsageDaily(
        day=datetime.now(UTC).date(), team=team, model=model, requests=1,
        prompt_tokens=tokens, completion_tokens=1, cost_usd=0.01,
    )  # fmt: skip


def test_a_team_member_sees_only_their_own_team(
    admin_gateway: Gateway, team: Any, sql: Any
) -> None:
    mine, key = team()
    theirs, _ = team()
    with Session(sql) as session:
        session.add(_usage_row(mine, 111_111, model="mine-model"))
        session.add(_usage_row(theirs, 999_999, model="their-model"))
        session.commit()
    with httpx.Client(base_url=admin_gateway.url) as client:
        token = csrf_of(client.get("/admin/team-usage/login"))
        bad = client.post("/admin/team-usage/login", data={"key": "ty-wrong", "csrf": token})
        assert bad.status_code == 401
        opened = client.post("/admin/team-usage/login", data={"key": key, "csrf": token})
        assert opened.status_code == 303
        page = client.get(f"/admin/team-usage?team={theirs}")  # asking for another team: ignored
        assert page.status_code == 200
        assert mine in page.text and "111,112" in page.text and "mine-model" in page.text
        assert theirs not in page.text and "their-model" not in page.text
        csv = client.get(f"/admin/team-usage.csv?team={theirs}&start={date.today()}")
        assert mine in csv.text and theirs not in csv.text
        # a team session opens no admin page
        assert client.get("/admin/teams").status_code == 303
        assert client.get("/admin/usage.csv").status_code == 303
        assert client.get("/admin/changes").status_code == 303  # nor the trail of changes


def test_revoking_the_key_closes_the_team_page(admin: httpx.Client, team: Any) -> None:
    name, key = team()
    with httpx.Client(base_url=admin.base_url) as member:
        token = csrf_of(member.get("/admin/team-usage/login"))
        member.post("/admin/team-usage/login", data={"key": key, "csrf": token})
        assert member.get("/admin/team-usage").status_code == 200
        page = admin.get(f"/admin/teams/{name}")
        revoked = admin.post(f"/admin/keys/{key[:12]}/revoke", data={"csrf": csrf_of(page)})
        assert revoked.status_code == 303
        assert member.get("/admin/team-usage").status_code == 303


def test_keys_are_created_with_a_name_and_an_expiry(admin: httpx.Client, team: Any) -> None:
    name, _ = team()
    page = admin.get("/admin/keys")
    made = admin.post(
        "/admin/keys",
        data={
            "team": name,
            "name": "nightly",
            "expires_in_days": "2",
            "models": MODEL,
            "rpm": "7",
            "csrf": csrf_of(page),
        },
    )
    assert made.status_code == 201 and "nightly" in made.text and "stops working on" in made.text
    listing = admin.get(f"/admin/teams/{name}").text
    in_two_days = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%d")
    assert "<td>nightly</td>" in listing and f"<td>{in_two_days} " in listing
    assert f"<td>{MODEL}</td>" in listing and "<td>the team&#39;s</td>" in listing
    assert "<td>7 rpm</td>" in listing
    prefix = made.text.split('id="new-key" class="secret">')[1][:12]
    rotated = admin.post(f"/admin/keys/{prefix}/rotate", data={"csrf": csrf_of(made)})
    assert rotated.status_code == 201 and f"Key {prefix}… revoked" in rotated.text
    assert "nightly" in rotated.text and "stops working on" in rotated.text  # kept by the new key
    assert (
        admin.post(f"/admin/keys/{prefix}/rotate", data={"csrf": csrf_of(made)}).status_code == 404
    )
    for field, bad, message in (
        ("expires_in_days", "soon", "a number of days"),
        ("expires_in_days", "-1", "in the future"),
        ("models", "gpt-nope", "not in the catalog: gpt-nope"),
        ("tpm", "lots", "Tokens per minute must be a whole number"),
    ):
        refused = admin.post(
            "/admin/keys",
            data={"team": name, field: bad, "csrf": csrf_of(admin.get("/admin/keys"))},
        )
        assert refused.status_code == 400 and message in refused.text, bad


def test_a_key_is_changed_in_place(admin: httpx.Client, admin_gateway: Gateway, team: Any) -> None:
    name, key = team()
    prefix = key[:12]
    assert f'href="/admin/keys/{prefix}"' in admin.get(f"/admin/teams/{name}").text
    page = admin.get(f"/admin/keys/{prefix}")
    assert page.status_code == 200 and 'name="expires_at"' in page.text
    wanted = {
        "name": "renamed",
        "models": MODEL,
        "expires_at": "2099-01-02T03:04",
        "rpm": "5",
        "usd_per_day": "2.5",
        "model_limits": f"{MODEL}: rpm=7, tpm=900",
        "scopes": "usage, completions",
    }
    saved = admin.post(f"/admin/keys/{prefix}", data={**wanted, "csrf": csrf_of(page)})
    assert saved.status_code == 303 and saved.headers["location"] == f"/admin/keys?saved={prefix}"
    listing = admin.get(f"/admin/teams/{name}").text
    assert "<td>renamed</td>" in listing and "<td>2099-01-02 03:04</td>" in listing
    assert f"<td>{MODEL}</td>" in listing
    assert f"<td>5 rpm, $2.50/day, {MODEL}: rpm=7, tpm=900, only completions, usage</td>" in listing
    again = admin.get(f"/admin/keys/{prefix}").text  # the form shows what was saved
    assert 'value="renamed"' in again and 'value="2099-01-02T03:04"' in again
    assert f'value="{MODEL}" checked' in again
    assert 'name="rpm" inputmode="numeric" value="5"' in again
    assert f'name="model_limits" size="50" value="{MODEL}: rpm=7, tpm=900"' in again
    assert 'name="scopes" size="50" value="completions,usage"' in again
    client = admin_gateway.client(key)
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4).choices
    for field, bad, message in (
        ("expires_at", "soon", "a date and time (UTC)"),
        ("expires_at", "2001-01-01T00:00", "must be a time in the future"),
        ("models", "gpt-nope", "not in the catalog: gpt-nope"),
        ("name", "x" * 65, "printable characters"),
        ("rpm", "-1", "Requests per minute must be 0 or more"),
        ("usd_per_day", "a lot", "Dollars per day must be a number"),
        ("model_limits", "gpt-nope: rpm=1", "Limits per model: not in the catalog: gpt-nope"),
        ("model_limits", f"{MODEL}: rpm=0", "Limits per model"),
        ("scopes", "completions, chat", "Endpoints names no scope chat"),
    ):
        form = {**wanted, field: bad, "csrf": csrf_of(page)}
        refused = admin.post(f"/admin/keys/{prefix}", data=form)
        assert refused.status_code == 400 and message in refused.text, bad
        assert "Nothing was saved" in refused.text
    assert "<td>renamed</td>" in admin.get(f"/admin/teams/{name}").text  # kept
    # blank fields clear the name, the expiry and the models (the team's again)
    page = admin.get(f"/admin/keys/{prefix}")
    cleared = admin.post(f"/admin/keys/{prefix}", data={"name": "", "csrf": csrf_of(page)})
    assert cleared.status_code == 303
    listing = admin.get(f"/admin/teams/{name}").text
    assert "renamed" not in listing and "2099-01-02" not in listing and "5 rpm" not in listing
    assert "<td>the team&#39;s</td>" in listing
    admin.post(f"/admin/keys/{prefix}/revoke", data={"csrf": csrf_of(page)})
    assert admin.get(f"/admin/keys/{prefix}").status_code == 404  # a revoked key is not edited
    gone = admin.post(f"/admin/keys/{prefix}", data={**wanted, "csrf": csrf_of(page)})
    assert gone.status_code == 404
    # the changes page shows each, made by the admin user, newest first, only this team's
    trail = admin.get("/admin/changes", params={"team": name}).text
    assert trail.count("<td>admin-ui:owner</td>") == 3  # updated twice, then revoked
    assert trail.index("key.revoke") < trail.index("key.update")
    assert "rpm: none → 5" in trail and "name: renamed → none" in trail
    assert f"models: none → {MODEL}" in trail  # the team's models, shown as none
    assert key not in trail and "<td>key.create</td>" in trail  # the fixture's, by the library


def test_end_users_are_blocked_and_unblocked_from_the_teams_page(
    admin: httpx.Client, admin_gateway: Gateway, team: Any
) -> None:
    name, key = team()
    page = admin.get(f"/admin/teams/{name}")
    assert "Blocked end users" in page.text
    made = admin.post(
        f"/admin/teams/{name}/block",
        data={"user": "mallory", "reason": "row 7", "csrf": csrf_of(page)},
    )
    assert made.status_code == 303 and made.headers["location"].endswith("?done=blocked")
    shown = admin.get(f"/admin/teams/{name}").text
    assert "<td>mallory</td><td>row 7</td>" in shown
    client = admin_gateway.client(key)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, user="mallory")
    for bad in ("mallory", "", "x" * 129):  # blocked already, blank, too long
        refused = admin.post(
            f"/admin/teams/{name}/block", data={"user": bad, "csrf": csrf_of(page)}
        )
        assert refused.status_code == 400 and "Not blocked:" in refused.text, bad
    gone = admin.post(
        f"/admin/teams/{name}/unblock", data={"user": "mallory", "csrf": csrf_of(page)}
    )
    assert gone.status_code == 303
    assert "<td>mallory</td>" not in admin.get(f"/admin/teams/{name}").text

    def served() -> bool:
        try:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, user="mallory")
        except openai.PermissionDeniedError:
            return False
        return True

    wait_until(served, 3, "the unblock to reach the gateway's key cache")
    again = admin.post(
        f"/admin/teams/{name}/unblock", data={"user": "mallory", "csrf": csrf_of(page)}
    )
    assert again.status_code == 404
    trail = admin.get("/admin/changes", params={"team": name}).text
    assert "user.unblock" in trail and "end_user: mallory" in trail


def test_an_expired_key_is_renamed_and_revived(admin: httpx.Client, team: Any, sql: Any) -> None:
    """The form shows an expiry to the minute; sent back unchanged it is kept, so renaming an
    expired key is not refused as an expiry in the past. A later expiry revives it."""
    name, _ = team()
    soon = datetime.now(UTC) + timedelta(seconds=1)
    prefix = keys.create_key(sql, name, "old", soon).prefix
    time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.1)
    page = admin.get(f"/admin/keys/{prefix}")
    assert "State: expired" in page.text
    shown = soon.strftime("%Y-%m-%dT%H:%M")
    form = {"name": "renamed", "expires_at": shown, "csrf": csrf_of(page)}
    assert admin.post(f"/admin/keys/{prefix}", data=form).status_code == 303
    renamed = keys.get_key(sql, prefix)
    assert renamed is not None and renamed.name == "renamed" and renamed.expires_at == soon
    form["expires_at"] = "2099-01-01T00:00"
    assert admin.post(f"/admin/keys/{prefix}", data=form).status_code == 303
    revived = keys.get_key(sql, prefix)
    assert revived is not None and revived.state == "active"


def test_pages_show_what_today_used_of_the_daily_budgets(
    admin: httpx.Client, team: Any, sql: Any, redis_server: Any
) -> None:
    """The team's page shows today's counters beside its daily limits, and a key with a dollar
    budget of its own its spend today (read from the quota counters the gateways charge)."""
    name, key = team(tokens_per_day=1000, usd_per_day=5.0)
    prefix, day, names = key[:12], day_number(), TeamKeys(name)
    counters = redis_sync.Redis.from_url(redis_server.url)
    counters.set(names.day_tokens(day), 321)
    counters.incrbyfloat(names.day_usd(day), 1_234_567)  # micro-dollars
    counters.incrbyfloat(names.key_day_usd(prefix, day), 250_000)
    page = admin.get(f"/admin/teams/{name}").text
    assert "<td>Tokens</td><td>321</td><td>1000</td>" in page
    assert "<td>Batch tokens</td><td>0</td><td>none</td>" in page
    assert "<td>Dollars</td><td>$1.2346</td><td>$5.00</td>" in page
    assert "Today (UTC):" not in admin.get(f"/admin/keys/{prefix}").text  # no budget of its own
    keys.update_key(sql, prefix, usd_per_day=2.5)
    assert "Today (UTC): $0.2500 of its $2.50 a day." in admin.get(f"/admin/keys/{prefix}").text


def test_a_teams_page_lists_its_dearest_end_users(admin: httpx.Client, team: Any, sql: Any) -> None:
    """From the records of the last 30 UTC days, the team's own only, dearest first."""
    name, _ = team()
    other, _ = team()
    now = datetime.now(UTC)
    spent = (("ann", 1, 0.5), ("bob", 0, 0.25), ("bob", 0, 0.125), (None, 2, 0.01))
    events = [
        event(team=name, end_user=u, ts=(now - timedelta(days=d)).timestamp(), cost_usd=c)
        for u, d, c in spent
    ]
    events.append(
        event(team=name, end_user="old", ts=(now - timedelta(days=30)).timestamp(), cost_usd=9.0)
    )
    events.append(event(team=other, end_user="zed", ts=now.timestamp(), cost_usd=7.0))
    store.write(sql, [to_row(decoder.decode(msgspec.json.encode(e))) for e in events])
    page = admin.get(f"/admin/teams/{name}").text
    rows = [
        line.strip()
        for line in page.splitlines()
        if line.strip().startswith("<tr><td>") and "$" in line
    ]
    users = [r for r in rows if r.startswith(("<tr><td>ann", "<tr><td>bob", "<tr><td>(none"))]
    assert users == [
        "<tr><td>ann</td><td>1</td><td>0</td><td>15</td><td>$0.5000</td></tr>",
        "<tr><td>bob</td><td>2</td><td>0</td><td>30</td><td>$0.3750</td></tr>",
        "<tr><td>(none named)</td><td>1</td><td>0</td><td>15</td><td>$0.0100</td></tr>",
    ]
    assert "<td>old</td>" not in page and "<td>zed</td>" not in page
    assert "No requests recorded." in admin.get(f"/admin/teams/{team()[0]}").text


def test_a_quota_change_reaches_another_gateway_within_a_second(
    admin: httpx.Client, team: Any, start_gateway: Any, redis_server: Any
) -> None:
    name, key = team(tpm=1_000_000)
    other = start_gateway().client(key)  # another process, sharing Redis and SQL
    other.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)  # caches the team
    page = admin.get(f"/admin/teams/{name}")
    saved = admin.post(
        f"/admin/teams/{name}",
        data={"tpm": "5", "default_tier": "interactive", "csrf": csrf_of(page)},
    )
    assert saved.status_code == 303
    changed_at = time.monotonic()
    while True:
        try:
            other.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8)
        except openai.RateLimitError as exc:
            assert exc.code == "tokens_per_minute"
            break
        assert time.monotonic() - changed_at < 1.0, "the other gateway still admits"
        time.sleep(0.05)
    assert "Every gateway enforces the new limits" in admin.get(saved.headers["location"]).text
    # the refusal shows on the live status page, by its limit
    status = admin.get("/admin/status")
    assert status.status_code == 200
    assert "<code>tokens_per_minute</code>" in status.text


def test_keys_show_their_last_use_and_charges(
    admin_gateway: Gateway, admin: httpx.Client, team: Any, sql: Any
) -> None:
    name, key = team()
    page = admin.get(f"/admin/teams/{name}")
    assert "never" in page.text and "<td>$0.0000</td>" in page.text
    admin_gateway.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    deadline = time.monotonic() + 5
    while "never" in admin.get(f"/admin/teams/{name}").text:
        assert time.monotonic() < deadline, "last use not recorded"
        time.sleep(0.1)
    keys_page = admin.get("/admin/keys")
    assert key[:12] in keys_page.text and key[12:] not in keys_page.text  # the secret never shows
    # charges: the key's rollup over the last 30 UTC days (the fake engine charges nothing, so two
    # records are written here: one inside the window, one just outside)
    now = datetime.now(UTC)
    for days_ago, cost in ((29, 0.125), (30, 100.0)):
        at = (now - timedelta(days=days_ago)).timestamp()
        usage = event(team=name, key_prefix=key[:12], ts=at, cost_usd=cost)
        store.write(sql, [to_row(decoder.decode(msgspec.json.encode(usage)))])
    assert "<td>$0.1250</td>" in admin.get(f"/admin/teams/{name}").text
    assert "<td>$0.1250</td>" in admin.get("/admin/keys").text


def test_status_shows_the_engine_replica(admin: httpx.Client, upstream: str) -> None:
    page = admin.get("/admin/status")
    assert page.status_code == 200
    assert upstream in page.text and "closed" in page.text
    assert 'http-equiv="refresh"' in page.text


def test_the_alerts_page_lists_a_teams_budget_alerts(
    admin: httpx.Client, team: Any, sql: Any
) -> None:
    """Budget alerts as billing recorded them, by team: the key's own budget named by its prefix,
    whether the webhook took each; another team's are left out when one team is asked for."""
    mine, _ = team()
    theirs, _ = team()
    now = datetime.now(UTC)
    rows = [
        (mine, "ty-mineKEY01", "key_usd_per_month", 80, now - timedelta(hours=1), None),
        (mine, "", "usd_per_day", 100, now, now),
        (theirs, "", "usd_per_day", 50, now, None),
    ]
    with Session(sql) as session:
        for name, prefix, budget, percent, at, sent in rows:
            session.add(
                BudgetAlert(
                    team=name,
                    key_prefix=prefix,
                    budget=budget,
                    period=f"{at:%Y-%m}" if "month" in budget else f"{at:%Y-%m-%d}",
                    percent=percent,
                    spent_usd=percent / 10,
                    limit_usd=10.0,
                    request_id="req-" + uuid.uuid4().hex,
                    created_at=at,
                    delivered_at=sent,
                )
            )
        session.commit()
    page = admin.get("/admin/alerts", params={"team": mine})
    assert page.status_code == 200
    body = page.text.split("<tbody>")[1]  # the table, not the team picker
    assert mine in body and theirs not in body
    assert body.index("usd_per_day") < body.index("key_usd_per_month")  # newest first
    assert "ty-mineKEY01" in body and "100%" in body and "80%" in body and "8.00" in body
    assert [cell for cell in ("<td>yes</td>", "<td>no</td>") if cell in body] == [
        "<td>yes</td>",
        "<td>no</td>",
    ]
    everyone = admin.get("/admin/alerts").text
    assert "50%" in everyone and theirs in everyone


def test_the_webhooks_page_lists_a_teams_events_and_sends_one_again(
    admin: httpx.Client, team: Any, sql: Any
) -> None:
    """A team's webhook events newest first, each with its state, tries and last error; one
    given up after its tries is sent again (its tries counted afresh, due at once); a delivered
    one, one too old for any sender and a missing one cannot be."""
    mine, _ = team()
    theirs, _ = team()
    now = datetime.now(UTC)
    ids = {k: "evt_" + uuid.uuid4().hex[:12] for k in ("done", "failing", "stale", "other")}
    rows = [
        ("done", mine, now - timedelta(hours=2), now, 1, None),
        ("failing", mine, now - timedelta(hours=1), None, 20, "webhook failed"),
        ("stale", mine, now - timedelta(days=4), None, 3, "webhook failed"),
        ("other", theirs, now, None, 0, None),
    ]
    with Session(sql) as session:
        for kind, name, at, sent, claims, error in rows:
            session.add(
                TeamEvent(
                    id=ids[kind],
                    team=name,
                    type="response.completed",
                    data={"id": f"resp_{kind}"},
                    created_at=at,
                    delivered_at=sent,
                    claims=claims,
                    last_error=error,
                )
            )
        session.commit()
    asked = {"team": mine, "start": f"{now - timedelta(days=5):%Y-%m-%d}"}
    page = admin.get("/admin/webhooks", params=asked)
    body = page.text.split("<tbody>")[1]
    assert theirs not in body and "resp_other" not in body
    assert body.index("resp_failing") < body.index("resp_done") < body.index("resp_stale")
    cells = re.findall(r"<td>(delivered|given up|pending)</td>", body)
    assert cells == ["given up", "delivered", "given up"]  # 20 tries; then older than 3 days
    assert body.count("webhook failed") == 2 and body.count("Send again") == 2
    token = csrf_of(page)
    sent = admin.post(
        f"/admin/webhooks/{ids['failing']}/send",
        params={"team": mine},
        data={"csrf": token},
        follow_redirects=False,
    )
    assert sent.status_code == 303 and f"again={ids['failing']}" in sent.headers["location"]
    with Session(sql) as session:
        again = session.get(TeamEvent, ids["failing"])
        assert again is not None and (again.claims, again.retry_at) == (0, None)
    body = admin.get(sent.headers["location"]).text  # back to the list, the team still chosen
    assert ids["failing"] in body.split('role="status"')[1].split("</p>")[0]
    assert theirs not in body.split("<tbody>")[1]
    assert re.findall(r"<td>(delivered|given up|pending)</td>", body)[0] == "pending"
    for kind in ("done", "stale"):
        refused = admin.post(f"/admin/webhooks/{ids[kind]}/send", data={"csrf": token})
        assert refused.status_code == 404
    missing = admin.post("/admin/webhooks/evt_nosuch/send", data={"csrf": token})
    assert missing.status_code == 404


def test_the_requests_page_lists_records_by_team_and_errors(
    admin: httpx.Client, team: Any, sql: Any
) -> None:
    """Each request's record, newest first; a team's alone when one is chosen; errors only when
    asked; a request id found by the client's own id too."""
    mine, _ = team()
    theirs, _ = team()
    made = [
        event(team=mine, status=200, client_request_id="ask-1", end_user="ida"),
        event(team=mine, status=502, error="upstream lost"),
        event(team=theirs, status=200),
    ]
    store.write(sql, [to_row(decoder.decode(msgspec.json.encode(e))) for e in made])
    body = admin.get("/admin/requests", params={"team": mine}).text.split("<tbody>")[1]
    assert made[0]["request_id"] in body and made[2]["request_id"] not in body
    assert body.index(made[1]["request_id"]) < body.index(made[0]["request_id"])  # newest first
    errors = admin.get("/admin/requests", params={"team": mine, "status": "error"}).text
    assert made[1]["request_id"] in errors and made[0]["request_id"] not in errors
    assert "upstream lost" in errors
    found = admin.get("/admin/requests", params={"request_id": "ask-1"}).text
    assert made[0]["request_id"] in found and "ida" in found


def test_a_receiver_the_team_set_stays_its_own_when_its_form_is_saved(
    admin: httpx.Client, team: Any, sql: Any
) -> None:
    """The team page says who set the receiver; saving the form with it unchanged keeps it held
    to the team's rule (public addresses), and only a new URL makes it the operator's."""
    name, _ = team()
    mine = "https://hooks.example.com/mine"
    teams.set_own_webhook(sql, name, mine, actor="team-api:test")
    page = admin.get(f"/admin/teams/{name}")
    assert "set by the team" in page.text
    form = {"csrf": csrf_of(page), "default_tier": "interactive", "webhook_url": mine, "rpm": "7"}
    assert admin.post(f"/admin/teams/{name}", data=form).status_code == 303
    saved = teams.get_team(sql, name)
    assert saved is not None and saved.rpm == 7 and saved.webhook_url_by_team
    form["webhook_url"] = "https://ops.example.com/hook"
    assert admin.post(f"/admin/teams/{name}", data=form).status_code == 303
    saved = teams.get_team(sql, name)
    assert saved is not None and not saved.webhook_url_by_team
    assert "set by the team" not in admin.get(f"/admin/teams/{name}").text
