"""The admin REST API (/v1/admin/…) against a gateway with an admin key: teams, budgets and keys,
each change applied to the next request (cached key lookups dropped), errors in OpenAI's shape."""

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest
from sqlmodel import Session

from tests.fuzzing import fuzz
from tests.gateway.conftest import MODEL, Gateway, free_port, tokenyard, wait_until
from tokenyard.tenancy.models import TeamEvent

ADMIN_KEY = "adm-" + uuid.uuid4().hex
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def admin(base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    env = {**base_env, "TOKENYARD_ADMIN_KEY": ADMIN_KEY, "TOKENYARD_GATEWAY_KEY_CACHE_S": "0.2"}
    gw = Gateway(env, tmp_path_factory.mktemp("admin") / "gateway.log")
    gw.api = httpx.Client(
        base_url=gw.url + "/v1/admin", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    yield gw
    gw.api.close()
    gw.stop()


def _works(gw: Any, key: str) -> bool:
    try:
        gw.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    except openai.AuthenticationError:
        return False
    return True


def test_the_admin_key_is_required(admin: Any, gateway: Any) -> None:
    for headers in ({}, {"authorization": "Bearer nope"}):
        reply = httpx.get(admin.url + "/v1/admin/teams", headers=headers)
        assert reply.status_code == 401
        assert reply.json()["error"]["code"] == "invalid_admin_key"
    # a gateway without an admin key has the admin API off
    off = httpx.get(gateway.url + "/v1/admin/teams", headers={"authorization": "Bearer x"})
    assert off.status_code == 403 and off.json()["error"]["code"] == "admin_off"


def test_models_are_checked_at_each_replica_by_the_api_and_the_command(
    admin: Any, base_env: dict[str, str], upstream: str
) -> None:
    """Each configured model's replicas (here the fake engine) sent the smallest real request,
    once: by the admin API and by `tokenyard models check`, which exits 1 when one fails."""
    reply = admin.api.post("/models/check", json={})
    assert reply.status_code == 200
    (check,) = reply.json()["data"]
    assert (check["model"], check["at"], check["ok"], check["status"]) == (
        MODEL,
        upstream,
        True,
        200,
    )
    assert check["latency_ms"] > 0 and check["error"] == ""
    missing = admin.api.post("/models/check", json={"models": ["nope"]})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert httpx.post(admin.url + "/v1/admin/models/check").status_code == 401
    done = tokenyard(base_env, ["models", "check", "--json"])
    assert done.returncode == 0, done.stderr
    assert [(c["model"], c["ok"]) for c in json.loads(done.stdout)] == [(MODEL, True)]
    dead = {**base_env, "TOKENYARD_ENGINE_URLS": f"{MODEL}=http://127.0.0.1:{free_port()}"}
    failed = tokenyard(dead, ["models", "check"])
    assert failed.returncode == 1 and "FAILED" in failed.stdout


def test_teams_lifecycle(admin: Any) -> None:
    api = admin.api
    name = "adm" + uuid.uuid4().hex[:8]
    made = api.post("/teams", json={"name": name, "rpm": 5, "models": [MODEL]})
    assert made.status_code == 201
    assert made.json() | {"created_at": None} == {
        "name": name,
        "rpm": 5,
        "tpm": None,
        "tokens_per_day": None,
        "batch_tokens_per_day": None,
        "usd_per_day": None,
        "usd_per_month": None,
        "concurrency": None,
        "kv_pages": None,
        "max_tokens": None,
        "max_context": None,
        "models": MODEL,
        "default_tier": "interactive",
        "auto_threshold": None,
        "strong_share": None,
        "auto_quality": None,
        "cache_ttl_s": None,
        "user_rpm": None,
        "user_tpm": None,
        "user_usd_per_day": None,
        "alert_url": None,
        "webhook_url": None,
        "model_limits": None,
        "scopes": None,
        "deployment_tags": None,
        "disabled": False,
        "created_at": None,
    }
    assert api.post("/teams", json={"name": name}).status_code == 409
    assert api.get(f"/teams/{name}").json()["rpm"] == 5
    assert name in [t["name"] for t in api.get("/teams").json()["data"]]
    # a field left out is kept, null makes it unlimited
    patched = api.patch(f"/teams/{name}", json={"tpm": 1000, "rpm": None}).json()
    assert (patched["rpm"], patched["tpm"], patched["models"]) == (None, 1000, MODEL)
    per_user = api.patch(f"/teams/{name}", json={"user_rpm": 3, "user_usd_per_day": 0.25}).json()
    assert (per_user["user_rpm"], per_user["user_usd_per_day"], per_user["tpm"]) == (3, 0.25, 1000)
    # deployment tags: each once, sorted, as the catalog spells them
    bound = api.patch(f"/teams/{name}", json={"deployment_tags": ["zero-retention", "eu", "eu"]})
    assert bound.json()["deployment_tags"] == "eu,zero-retention"
    refused = api.patch(f"/teams/{name}", json={"deployment_tags": "EU!"})
    assert refused.status_code == 400 and "deployment_tags" in refused.json()["error"]["message"]
    assert (
        api.patch(f"/teams/{name}", json={"deployment_tags": None}).json()["deployment_tags"]
        is None
    )
    # 2**63 overflowed SQL's integers (a 500); above 2**53 the quota script's numbers lose counts
    too_big = ({"batch_tokens_per_day": 2**63}, {"tpm": 2**53 + 1}, {"usd_per_day": 1e300})
    negative = ({"rpm": -1}, {"user_tpm": -5})
    per_model = {MODEL: {"rpm": 100, "tpm": 50_000}, "other": {"tpm": 5}}
    assert api.patch(f"/teams/{name}", json={"model_limits": per_model}).json()["model_limits"] == (
        per_model
    )
    assert api.patch(f"/teams/{name}", json={"model_limits": None}).json()["model_limits"] is None
    odd_model_limits = (
        {"model_limits": {MODEL: {"rpm": 0}}},
        {"model_limits": {MODEL: {"burst": 3}}},
        {"model_limits": {MODEL: {}}},
        {"model_limits": {"": {"rpm": 1}}},
        {"model_limits": {MODEL: {"rpm": 2**53 + 1}}},
        {"model_limits": [MODEL]},
    )
    for field in ("alert_url", "webhook_url"):
        hooks = api.patch(f"/teams/{name}", json={field: "https://hooks.example.com/x"}).json()
        assert hooks[field] == "https://hooks.example.com/x"
    odd_urls = ({"alert_url": "file:///etc/passwd"}, {"alert_url": "http://u:p@example.com/"})
    odd_urls += ({"webhook_url": "ftp://hooks.example.com/"}, {"webhook_url": "x" * 3000})
    for bad in (
        *negative,
        {"nope": 1},
        {"default_tier": "gold"},
        {"strong_share": 2},
        *too_big,
        *odd_urls,
        *odd_model_limits,
    ):
        reply = api.patch(f"/teams/{name}", json=bad)
        assert reply.status_code == 400, bad
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert api.post("/teams", json={"name": "../x"}).status_code == 400
    missing = api.patch("/teams/no-such-team", json={"rpm": 1})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert api.delete(f"/teams/{name}").json() == {"name": name, "deleted": True}
    assert api.get(f"/teams/{name}").status_code == 404


def test_keys_limits_disable_and_budget_apply_at_once(admin: Any) -> None:
    api = admin.api
    name = "adm" + uuid.uuid4().hex[:8]
    api.post("/teams", json={"name": name, "models": ["another-model"]})
    created = api.post("/keys", json={"team": name})
    assert created.status_code == 201
    key, prefix = created.json()["key"], created.json()["prefix"]
    assert key.startswith(prefix)
    listed = api.get("/keys", params={"team": name}).json()["data"]
    assert [k["prefix"] for k in listed] == [prefix] and key not in str(listed)
    assert api.post("/keys", json={"team": "no-such-team"}).status_code == 404

    # the team may not use the model yet; allowing it applies to the next request
    with pytest.raises(openai.NotFoundError):
        admin.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    api.patch(f"/teams/{name}", json={"models": []})
    wait_until(lambda: _works(admin, key), 3, "the new limits to apply")

    assert api.post(f"/teams/{name}/disable").json()["disabled"] is True
    wait_until(lambda: not _works(admin, key), 3, "the disabled team's key to be refused")
    assert api.post(f"/teams/{name}/enable").json()["disabled"] is False
    wait_until(lambda: _works(admin, key), 3, "the enabled team's key to work")

    budget = api.put(f"/teams/{name}/budget", json={"tokens_per_day": 10000, "usd_per_day": 2.5})
    assert budget.json()["tokens_per_day"] == 10000 and budget.json()["usd_per_day"] == 2.5
    assert budget.json()["today"]["tokens"] > 0  # the requests above
    assert api.get(f"/teams/{name}").json()["tokens_per_day"] == 10000
    assert api.put(f"/teams/{name}/budget", json={"rpm": 3}).status_code == 400

    rotated = api.post(f"/keys/{prefix}/rotate")
    assert rotated.status_code == 201 and rotated.json()["revoked"] == prefix
    new_key = rotated.json()["key"]
    wait_until(lambda: not _works(admin, key), 3, "the rotated key to be refused")
    assert _works(admin, new_key)
    assert api.post(f"/keys/{prefix}/rotate").status_code == 404  # already revoked
    new_prefix = rotated.json()["prefix"]
    assert api.post(f"/keys/{new_prefix}/revoke").json() == {"prefix": new_prefix, "revoked": True}
    wait_until(lambda: not _works(admin, new_key), 3, "the revoked key to be refused")

    # every change above is in the trail, newest first, each by the admin API
    trail = api.get("/changes", params={"team": name}).json()
    actions = [c["action"] for c in trail["data"]]
    assert actions[:3] == ["key.revoke", "key.rotate", "team.update"]
    assert actions[-2:] == ["key.create", "team.create"] and not trail["has_more"]
    assert {c["actor"] for c in trail["data"]} == {"admin-api:admin"}
    budget_set = {"tokens_per_day": [None, 10000], "usd_per_day": [None, 2.5]}
    assert trail["data"][2]["details"] == budget_set
    assert key not in str(trail) and new_key not in str(trail)
    page = api.get("/changes", params={"team": name, "limit": 2}).json()
    assert [c["action"] for c in page["data"]] == actions[:2] and page["has_more"]
    after = api.get("/changes", params={"limit": 1, "before": page["data"][-1]["id"]}).json()
    assert after["data"][0]["id"] < page["data"][-1]["id"]
    for bad in ({"limit": "0"}, {"limit": "x"}, {"before": "-1"}):
        assert api.get("/changes", params=bad).status_code == 400, bad


def test_end_users_are_blocked_and_unblocked_at_once(admin: Any) -> None:
    api = admin.api
    name = "adm" + uuid.uuid4().hex[:8]
    api.post("/teams", json={"name": name})
    key = api.post("/keys", json={"team": name}).json()["key"]

    def served(user: str) -> bool:
        try:
            admin.client(key).chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=2, user=user
            )
        except openai.PermissionDeniedError:
            return False
        return True

    assert served("a/b c")  # cached now: the block must drop it
    made = api.post(f"/teams/{name}/blocked-users", json={"user": "a/b c", "reason": "spam"})
    assert made.status_code == 201 and made.json()["blocked"] is True
    wait_until(lambda: not served("a/b c"), 3, "the block to apply")
    assert served("someone else")
    listed = api.get(f"/teams/{name}/blocked-users").json()["data"]
    assert [(b["user"], b["reason"]) for b in listed] == [("a/b c", "spam")]
    again = api.post(f"/teams/{name}/blocked-users", json={"user": "a/b c"})
    assert again.status_code == 409
    for bad in ({"user": ""}, {"user": "x" * 129}, {"reason": "no user"}):
        assert api.post(f"/teams/{name}/blocked-users", json=bad).status_code == 400, bad
    missing = api.post("/teams/no-such-team/blocked-users", json={"user": "x"})
    assert missing.status_code == 404
    gone = api.delete(f"/teams/{name}/blocked-users", params={"user": "a/b c"})
    assert gone.json() == {"team": name, "user": "a/b c", "blocked": False}
    wait_until(lambda: served("a/b c"), 3, "the unblock to apply")
    assert api.delete(f"/teams/{name}/blocked-users", params={"user": "a/b c"}).status_code == 404
    assert api.delete(f"/teams/{name}/blocked-users").status_code == 400
    trail = api.get("/changes", params={"team": name, "limit": 2}).json()["data"]
    assert [c["action"] for c in trail] == ["user.unblock", "user.block"]


def test_openapi_documents_the_admin_api(admin: Any) -> None:
    paths = httpx.get(admin.url + "/schema/openapi.json").json()["paths"]
    assert {"post", "get"} <= paths["/v1/admin/teams"].keys()
    assert {"get", "patch", "delete"} <= paths["/v1/admin/teams/{name}"].keys()
    assert {"get", "put"} <= paths["/v1/admin/teams/{name}/budget"].keys()
    assert "post" in paths["/v1/admin/keys/{prefix}/rotate"]
    body = paths["/v1/admin/teams"]["post"]["requestBody"]["content"]["application/json"]
    assert {"name", "rpm", "usd_per_day"} <= body["schema"]["properties"].keys()


def test_the_cli_disables_teams_and_rotates_keys(admin: Any, base_env: dict[str, str]) -> None:
    """The same operations from `tokenyard teams` and `tokenyard keys`."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = tokenyard(base_env, [*args])
        assert done.returncode == 0, done.stderr
        return done

    name = "cli" + uuid.uuid4().hex[:8]
    per_model = f"{MODEL}: rpm=100, tpm=50000; other: tpm=5"
    made = json.loads(run("teams", "create", name, "--model-limits", per_model, "--json").stdout)
    assert made[0]["model_limits"] == {MODEL: {"rpm": 100, "tpm": 50000}, "other": {"tpm": 5}}
    key = run("keys", "create", "--team", name).stdout.strip().splitlines()[-1]
    assert json.loads(run("teams", "disable", name, "--json").stdout)[0]["disabled"] is True
    wait_until(lambda: not _works(admin, key), 3, "the disabled team's key to be refused")
    assert json.loads(run("teams", "enable", name, "--json").stdout)[0]["disabled"] is False
    wait_until(lambda: _works(admin, key), 3, "the enabled team's key to work")
    new_key = run("keys", "rotate", key[:12]).stdout.strip().splitlines()[-1]
    assert new_key.startswith("ty-") and new_key != key
    wait_until(lambda: not _works(admin, key), 3, "the rotated key to be refused")
    assert _works(admin, new_key)
    # a named key that expires in a day
    made = run("keys", "create", "--team", name, "--name", "ci", "--expires-in-days", "1")
    assert "expires " in made.stdout.splitlines()[0]
    listed = json.loads(run("keys", "list", "--team", name, "--json").stdout)
    (named,) = [k for k in listed if k["name"] == "ci"]
    assert named["state"] == "active" and named["expires_at"] is not None
    past = tokenyard(base_env, ["keys", "create", "--team", name, "--expires-in-days", "-1"])
    assert past.returncode == 1 and "in the future" in past.stderr
    odd = ["teams", "update", name, "--model-limits", f"{MODEL}: rpm=many"]
    typo = tokenyard(base_env, [*odd])
    assert typo.returncode == 2 and f"'{MODEL}': 'rpm=many' is not rpm=N or tpm=N" in typo.stderr
    # the trail names the operating-system user who ran each command
    trail = json.loads(run("teams", "changes", name, "--json").stdout)
    assert [c["action"] for c in trail] == [
        "key.create",  # the one with a name; the expired one was refused, and is not here
        "key.rotate",
        "team.enable",
        "team.disable",
        "key.create",
        "team.create",
    ]
    assert trail[0]["details"]["name"] == "ci" and trail[-1]["actor"].startswith("cli")
    assert {c["actor"] for c in trail} == {trail[-1]["actor"]}
    assert "team.disable" in run("teams", "changes", name).stdout
    # an end user blocked and unblocked from the command line
    assert "blocked end user 'eve'" in run("teams", "block", name, "eve", "--reason", "r").stdout
    assert json.loads(run("teams", "blocked", name, "--json").stdout)[0]["user"] == "eve"
    assert "eve" in run("teams", "blocked", name).stdout
    run("teams", "unblock", name, "eve")
    assert json.loads(run("teams", "blocked", name, "--json").stdout) == []


def test_fuzz_the_admin_api_with_the_admin_key(admin: Any) -> None:
    """Drawn bodies, names and prefixes for every admin operation, with the key that passes the
    guard: no 5xx, every refusal in OpenAI's shape."""
    ran = fuzz(
        admin.url,
        10,
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        skip=lambda method, path: not path.startswith("/v1/admin/") or path == "/v1/admin/usage",
    )
    assert {"POST /v1/admin/teams", "PATCH /v1/admin/teams/{name}", "POST /v1/admin/keys"} <= set(
        ran
    )


def test_named_keys_expire(admin: Any) -> None:
    api = admin.api
    name = "exp" + uuid.uuid4().hex[:8]
    api.post("/teams", json={"name": name})
    soon = int(time.time()) + 3
    made = api.post("/keys", json={"team": name, "name": "ci", "expires_at": soon}).json()
    assert (made["name"], made["expires_at"]) == ("ci", soon)
    assert _works(admin, made["key"])
    (listed,) = api.get("/keys", params={"team": name}).json()["data"]
    assert (listed["name"], listed["state"]) == ("ci", "active")
    # rotating keeps the name and the expiry
    rotated = api.post(f"/keys/{made['prefix']}/rotate").json()
    assert (rotated["name"], rotated["expires_at"]) == ("ci", soon)
    wait_until(lambda: not _works(admin, rotated["key"]), 8, "the key to expire")
    states = {
        k["prefix"]: k["state"] for k in api.get("/keys", params={"team": name}).json()["data"]
    }
    assert states == {made["prefix"]: "revoked", rotated["prefix"]: "expired"}
    for bad in (
        {"team": name, "expires_at": int(time.time()) - 1},  # already past
        {"team": name, "expires_at": 10**12},  # no time a clock reaches
        {"team": name, "name": "x" * 65},
        {"team": name, "name": "tab\there"},
    ):
        refused = api.post("/keys", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["type"] == "invalid_request_error"


def test_a_key_narrows_its_teams_models(admin: Any) -> None:
    api = admin.api
    name = "nar" + uuid.uuid4().hex[:8]
    api.post("/teams", json={"name": name})
    elsewhere = api.post("/keys", json={"team": name, "models": ["another-model"]}).json()
    assert elsewhere["models"] == ["another-model"]
    with pytest.raises(openai.NotFoundError):  # as a model the team may not use
        admin.client(elsewhere["key"]).chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2
        )
    assert admin.client(elsewhere["key"]).models.list().data == []
    fake_only = api.post("/keys", json={"team": name, "models": [MODEL]}).json()
    assert _works(admin, fake_only["key"])
    (listed,) = [
        k for k in api.get("/keys", params={"team": name}).json()["data"] if k["models"] == [MODEL]
    ]
    assert listed["prefix"] == fake_only["prefix"]
    # the team's own list bounds its keys': narrowed to another model, this key may use none
    api.patch(f"/teams/{name}", json={"models": ["another-model"]})

    def not_allowed() -> bool:
        try:
            _works(admin, fake_only["key"])
        except openai.NotFoundError:
            return True
        return False

    wait_until(not_allowed, 3, "the team's narrower list to apply")
    refused = api.post("/keys", json={"team": name, "models": [MODEL]})
    assert refused.status_code == 400 and "may not use" in refused.json()["error"]["message"]


def test_a_key_is_changed_in_place(admin: Any, base_env: dict[str, str]) -> None:
    api = admin.api
    name = "chg" + uuid.uuid4().hex[:8]
    api.post("/teams", json={"name": name})
    made = api.post("/keys", json={"team": name, "name": "old", "models": ["another-model"]}).json()

    def refused() -> bool:
        try:
            _works(admin, made["key"])
        except openai.NotFoundError:
            return True
        return False

    assert refused()
    later = int(time.time()) + 86400
    changed = api.patch(f"/keys/{made['prefix']}", json={"models": [], "expires_at": later})
    assert changed.status_code == 200, changed.text
    record = changed.json()
    assert (record["name"], record["models"], record["state"]) == ("old", [], "active")
    # a name, and limits of the key's own (null: the team's alone again)
    per_model = {MODEL: {"rpm": 3, "tpm": 900}}
    renamed = api.patch(
        f"/keys/{made['prefix']}",
        json={"name": "new", "rpm": 5, "tpm": None, "concurrency": 2, "model_limits": per_model},
    )
    assert renamed.json()["name"] == "new"
    assert renamed.json()["limits"] == {
        "rpm": 5,
        "tpm": None,
        "usd_per_day": None,
        "usd_per_month": None,
        "concurrency": 2,
        "model_limits": per_model,
        "scopes": None,
    }
    assert record["expires_at"].startswith(time.strftime("%Y-%m-%d", time.gmtime(later)))
    wait_until(lambda: _works(admin, made["key"]), 3, "the key's wider models to apply")
    for bad in (
        {"expires_at": 1},
        {"models": "all"},
        {"team": name},
        {"rpm": -1},
        {"tpm": 2**60},
        {"concurrency": 1.5},
        {"model_limits": {MODEL: {"rpm": 0}}},
        {"model_limits": {MODEL: {"burst": 3}}},
        {"model_limits": [MODEL]},
    ):
        assert api.patch(f"/keys/{made['prefix']}", json=bad).status_code == 400, bad
    assert api.patch("/keys/ty-nosuchkey0", json={"name": "x"}).status_code == 404
    # and from the CLI
    done = tokenyard(
        base_env,
        [
            "keys",
            "update",
            made["prefix"],
            "--name",
            "",
            "--no-expiry",
            "--rpm",
            "0",
            "--usd-per-day",
            "1.5",
            "--concurrency",
            "0",
            "--model-limits",
            f"{MODEL}: tpm=700",
            "--scopes",
            "embeddings, completions",
            "--json",
        ],
    )
    assert done.returncode == 0, done.stderr
    (shown,) = json.loads(done.stdout)
    assert (shown["name"], shown["expires_at"], shown["prefix"]) == (None, None, made["prefix"])
    # rpm and concurrency 0: cleared; the limits per model replaced
    assert shown["limits"] == {
        "rpm": None,
        "tpm": None,
        "usd_per_day": 1.5,
        "usd_per_month": None,
        "concurrency": None,
        "model_limits": {MODEL: {"tpm": 700}},
        "scopes": "completions,embeddings",  # each once, in the scopes' own order
    }
    # a key's limits per model cleared with null, as the team's are; scopes set as a list
    cleared = api.patch(
        f"/keys/{made['prefix']}", json={"model_limits": None, "scopes": ["batch"]}
    ).json()
    assert cleared["limits"]["model_limits"] is None and cleared["limits"]["scopes"] == "batch"
    wrong = api.patch(f"/keys/{made['prefix']}", json={"scopes": ["chat"]})
    assert wrong.status_code == 400 and "chat" in wrong.json()["error"]["message"]
    assert (
        api.patch(f"/keys/{made['prefix']}", json={"scopes": None}).json()["limits"]["scopes"]
        is None
    )


def test_named_admin_keys_say_who_changed_what(start_gateway: Any) -> None:
    """Each of TOKENYARD_ADMIN_KEYS opens the admin API under its holder's name, which the trail
    of changes records; a key not on the list (or one dropped from it) is a 401."""
    alice, bot = "a-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex
    gw = start_gateway(admin_key=ADMIN_KEY, admin_keys=f"alice={alice}, deploy-bot={bot}")
    name = "adm" + uuid.uuid4().hex[:8]

    def call(key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.request(method, gw.url + "/v1/admin" + path, headers=headers, **kwargs)

    assert call(alice, "POST", "/teams", json={"name": name}).status_code == 201
    assert call(bot, "PATCH", f"/teams/{name}", json={"rpm": 7}).status_code == 200
    assert call(ADMIN_KEY, "POST", f"/teams/{name}/disable").status_code == 200
    trail = call(bot, "GET", f"/changes?team={name}").json()["data"]
    assert [(c["actor"], c["action"]) for c in trail] == [
        ("admin-api:admin", "team.disable"),
        ("admin-api:deploy-bot", "team.update"),
        ("admin-api:alice", "team.create"),
    ]
    refused = call(alice[:-1] + "x", "GET", "/teams")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_admin_key"
    usage = call(bot, "GET", f"/usage?team={name}")  # billing's admin routes take them too
    assert usage.status_code == 200


@pytest.mark.parametrize(
    "spec",
    [
        "alice",
        "alice=short",
        "alice=0123456789abcdef,alice=fedcba9876543210",
        "a b=0123456789abcdef",
    ],
)
def test_a_bad_admin_key_list_stops_the_settings(spec: str) -> None:
    from pydantic import ValidationError

    from tokenyard.core.settings import Settings

    with pytest.raises(ValidationError, match="NAME=KEY"):
        Settings(admin_keys=spec)  # type: ignore[arg-type]


def test_webhook_events_are_listed_and_sent_again(admin: Any, sql: Any) -> None:
    """A team reads its own webhook events (to debug its receiver), the admin any team's; the
    admin sends one not delivered again, its tries counted afresh; a delivered one is a 404."""
    api = admin.api
    mine, theirs = ("ev" + uuid.uuid4().hex[:8] for _ in range(2))
    for name in (mine, theirs):
        assert api.post("/teams", json={"name": name}).status_code == 201
    key = api.post("/keys", json={"team": mine}).json()["key"]
    now = datetime.now(UTC)
    rows = {
        "evt_" + uuid.uuid4().hex[:12]: (mine, now, 20, "webhook failed"),
        "evt_" + uuid.uuid4().hex[:12]: (mine, None, 1, None),
        "evt_" + uuid.uuid4().hex[:12]: (theirs, None, 0, None),
    }
    with Session(sql) as session:
        for event_id, (team, delivered, claims, error) in rows.items():
            session.add(
                TeamEvent(
                    id=event_id,
                    team=team,
                    type="batch.completed",
                    data={"id": "batch_x"},
                    delivered_at=delivered,
                    claims=claims,
                    last_error=error,
                )
            )
        session.commit()
    delivered, pending, other = rows
    own = httpx.get(admin.url + "/v1/usage/events", headers={"authorization": f"Bearer {key}"})
    assert own.status_code == 200
    listed = {e["id"]: e for e in own.json()["data"]}
    assert set(listed) == {delivered, pending}  # never another team's
    assert listed[delivered]["state"] == "delivered" and listed[pending]["state"] == "pending"
    assert listed[delivered]["type"] == "batch.completed" and listed[pending]["tries"] == 1
    every = api.get("/usage/events").json()["data"]
    assert {delivered, pending, other} <= {e["id"] for e in every}
    assert api.post(f"/events/{delivered}/send").status_code == 404
    assert api.post("/events/evt_nosuch/send").json()["error"]["code"] == "not_found"
    again = api.post(f"/events/{other}/send")
    assert again.status_code == 200 and again.json()["state"] == "pending"
    with Session(sql) as session:
        found = session.get(TeamEvent, other)
        assert found is not None and (found.claims, found.retry_at) == (0, None)
    refused = httpx.post(
        admin.url + f"/v1/admin/events/{pending}/send", headers={"authorization": f"Bearer {key}"}
    )
    assert refused.status_code == 401  # a team's key is no admin key
