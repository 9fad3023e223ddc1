"""The OpenAI-compatible API through the official SDK: auth, completions, streaming, models, usage,
bad input, and the management CLI."""

import json
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
import openai
import pytest
from sqlmodel import Session, select

from tests.gateway.conftest import (
    MODEL,
    free_port,
    reservations,
    tokenyard,
    upstream_stats,
    wait_until,
)
from tokenyard.billing.models import UsageRecord
from tokenyard.core.settings import Settings
from tokenyard.tenancy.keys import hash_key
from tokenyard.tenancy.service import cache_key

CHAT = [{"role": "user", "content": "one two three #chunks=4"}]


def test_auth_errors_and_revocation(gateway: Any, team: Any, base_env: dict, redis_server) -> None:
    _, key = team()
    with pytest.raises(openai.AuthenticationError) as err:
        gateway.client("ty-not-a-key").models.list()
    assert err.value.code == "invalid_api_key"
    assert err.value.body["type"] == "invalid_request_error"  # OpenAI's type for a bad key
    missing = httpx.get(gateway.url + "/v1/models")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"

    client = gateway.client(key)
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4).choices
    prefix = key[:12]
    cli = tokenyard(base_env, ["keys", "revoke", prefix])
    assert cli.returncode == 0, cli.stderr
    revoked_at = time.monotonic()
    while True:  # the in-process cache may answer for at most its TTL (0.5 s)
        try:
            client.models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() - revoked_at < 1.0, "revoked key still accepted after 1 s"
        time.sleep(0.05)
    # the secret never reaches the logs
    assert key not in gateway.log.read_text()


def test_chat_completion_and_headers(gateway: Any, team: Any, upstream: str) -> None:
    name, key = team()
    raw = gateway.client(key).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=10,
        extra_headers={"x-client-request-id": "my-req-1"},
    )
    reply = raw.parse()
    assert reply.choices[0].message.content == "tok " * 4
    assert reply.usage.completion_tokens == 4
    # the id is the gateway's own; the client's is kept beside it
    assert raw.headers["x-request-id"].startswith("req-")
    assert raw.headers["x-client-request-id"] == "my-req-1"
    assert raw.headers["x-tokenyard-model"] == MODEL
    seen = upstream_stats(upstream)["last_headers"]
    assert seen["x-tenant"] == name
    assert seen["x-priority"] == "interactive"
    assert seen["x-request-id"] == raw.headers["x-request-id"]


def test_streaming_with_and_without_usage(gateway: Any, team: Any, upstream: str) -> None:
    _, key = team(default_tier="batch")
    client = gateway.client(key)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=10, stream=True, extra_body={"tier": "batch"}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "tok " * 4
    assert all(c.usage is None for c in chunks)  # not asked for: the gateway drops it
    assert upstream_stats(upstream)["last_headers"]["x-priority"] == "batch"
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="a b c #chunks=3",
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [c.choices[0].text for c in chunks[:-1]] == ["tok "] * 3
    assert chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.prompt_tokens == 4


def test_models_and_model_access(gateway: Any, team: Any) -> None:
    _, key = team()
    models = gateway.client(key).models.list().data
    assert [m.id for m in models] == [MODEL, "auto"]
    assert models[0].model_extra["ready"] is True
    assert models[0].owned_by == "self-hosted"
    _, restricted = team(models="other-model")
    client = gateway.client(restricted)
    assert client.models.list().data == []
    for model in (MODEL, "no-such-model"):
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model=model, messages=CHAT)
        assert err.value.code == "model_not_found"
        assert err.value.body["param"] == "model"


def test_an_alias_is_served_as_its_model(gateway: Any, team: Any, sql: Any) -> None:
    _, key = team(models=MODEL)  # the allow-list names the model; its alias is the same model
    client = gateway.client(key)
    reply = client.chat.completions.with_raw_response.create(model="gpt-3.5-turbo", messages=CHAT)
    assert reply.headers["x-tokenyard-model"] == MODEL and reply.parse().model == MODEL
    request_id = reply.headers["x-request-id"]

    def recorded() -> UsageRecord | None:
        with Session(sql) as session:
            query = select(UsageRecord).where(UsageRecord.request_id == request_id)
            return session.exec(query).first()

    wait_until(recorded, 10, "the usage record")
    assert recorded().model == MODEL  # type: ignore[union-attr]
    assert client.models.retrieve("gpt-3.5-turbo").id == MODEL
    card = client.models.list().data[0]
    assert card.model_extra["aliases"] == ["gpt-3.5-turbo"]


def test_usage_endpoint_reports_settled_tokens(gateway: Any, team: Any) -> None:
    _, key = team()
    client = gateway.client(key)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=50)
    list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=50, stream=True))

    def usage() -> dict:
        url = gateway.url + "/v1/usage"
        return httpx.get(url, headers={"authorization": f"Bearer {key}"}).json()

    # billing's consumer writes the records from the usage stream moments after settling
    wait_until(lambda: usage()["requests"] == 2, 5, "both requests recorded")
    # the upstream's counts (4 words, 4 chunks), not the reservation (estimate + max_tokens)
    assert usage()["models"][MODEL] == {
        "requests": 2,
        "errors": 0,
        "prompt_tokens": 8,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "completion_tokens": 8,
        "cost_usd": 0.0,  # the test catalog gives the fake model no price
        "list_cost_usd": 0.0,
        "total_tokens": 16,
    }
    bad = httpx.get(
        gateway.url + "/v1/usage?date=yesterday", headers={"authorization": f"Bearer {key}"}
    )
    assert bad.status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{not json", 400, "invalid_json", None),
        (b"[1, 2]", 400, None, None),
        (b'{"model": "fake", "messages": "hi"}', 400, None, "messages"),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400, None, "model"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, None, "model"),
        (
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model_not_found",
            "model",
        ),
        (
            b'{"model": "fake", "max_tokens": 5000, '
            b'"messages": [{"role": "user", "content": "x"}]}',
            400,
            "max_tokens_exceeded",
            "max_tokens",
        ),
        (
            b'{"model": "fake", "max_tokens": 100, "messages": [{"role": "user", "content": "'
            + b"x" * 9000
            + b'"}]}',
            400,
            "context_length_exceeded",
            "messages",
        ),
        (
            b'{"model": "fake", "max_tokens": 1900, "messages": [{"role": "user", "content": "'
            + b"x" * 600
            + b'"}]}',
            400,
            "context_length_exceeded",
            "max_tokens",
        ),
        (
            b'{"model": "fake", "messages": [{"role": "user", "content": "'
            + b"x" * 5_000_000
            + b'"}]}',
            413,
            "request_too_large",
            None,
        ),
    ],
)
def test_bad_input_is_refused_openai_style(
    gateway: Any, team: Any, redis_server: Any, body: bytes, status: int, code: Any, param: Any
) -> None:
    name, key = team()
    reply = httpx.post(
        gateway.url + "/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert reservations(redis_server.client(), name)["leases"] == 0


def test_health_ready_metrics(gateway: Any) -> None:
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/ready").json()
    assert ready == {"ready": True, "redis": True, "models": {MODEL: True}}
    text = httpx.get(gateway.url + "/metrics").text
    assert "tokenyard_gateway_requests_total" in text


def test_engine_down_is_503_not_ready(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(engine_urls=f"{MODEL}=http://127.0.0.1:{free_port()}")
    _, key = team()
    client = gw.client(key)
    assert client.models.list().data[0].model_extra["ready"] is False
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT)
    assert err.value.status_code == 503
    assert err.value.code == "model_not_ready"
    assert err.value.response.headers["retry-after"] == "1"
    assert httpx.get(gw.url + "/ready").status_code == 503


def test_teams_cli(base_env: dict) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return tokenyard(base_env, list(args))

    made = run("teams", "create", "cli-team", "--rpm", "5", "--kv-pages", "40", "--models", "a,b")
    assert made.returncode == 0, made.stderr
    assert "rpm=5" in made.stdout and "kv_pages=40" in made.stdout and "models=a,b" in made.stdout
    assert run("teams", "create", "cli-team").returncode == 1  # exists
    updated = run("teams", "update", "cli-team", "--rpm", "7", "--usd-per-day", "2.5")
    assert "rpm=7" in updated.stdout and "usd_per_day=2.5" in updated.stdout
    per_user = run("teams", "update", "cli-team", "--user-rpm", "3", "--user-usd-per-day", "0.5")
    assert "user_rpm=3" in per_user.stdout and "user_usd_per_day=0.5" in per_user.stdout
    assert "cli-team: rpm=7" in run("teams", "list").stdout
    key = run("keys", "create", "--team", "cli-team").stdout.strip().splitlines()[-1]
    assert key.startswith("ty-") and len(key) > 40
    assert run("keys", "create", "--team", "no-team").returncode == 1
    assert run("keys", "revoke", "ty-nosuchkey").returncode == 1


def test_streams_tell_proxies_not_to_buffer(gateway: Any, team: Any) -> None:
    _, key = team()
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    url = gateway.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        assert r.read().endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/models", 401),  # no key
        ("POST", "/v1/chat/completions", 400),  # a body that is no JSON
        ("GET", "/v1/nowhere", 404),
        ("DELETE", "/v1/chat/completions", 405),
        ("GET", "/health", 200),
    ],
)
def test_every_response_carries_a_request_id(
    gateway: Any, team: Any, method: str, path: str, status: int
) -> None:
    """Errors too, so the SDKs' error.request_id is there exactly when a user needs to quote it."""
    _, key = team()
    headers = {} if status == 401 else {"authorization": f"Bearer {key}"}
    reply = httpx.request(method, gateway.url + path, headers=headers, content=b"{oops")
    assert reply.status_code == status
    assert reply.headers["x-request-id"].startswith("req-")
    with pytest.raises(openai.AuthenticationError) as err:
        gateway.client("ty-wrong").models.list()
    assert err.value.request_id and err.value.request_id.startswith("req-")


def test_models_retrieve_and_unknown_paths(gateway: Any, team: Any) -> None:
    _, key = team()
    client = gateway.client(key)
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve("auto").owned_by == "tokenyard"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found"
    lost = httpx.get(gateway.url + "/v1/chat/complete", headers={"authorization": f"Bearer {key}"})
    assert lost.status_code == 404 and "/schema/openapi.json" in lost.json()["error"]["message"]
    assert "/v1/chat/complete" in lost.json()["error"]["message"]


def test_operator_cli(base_env: dict, gateway: Any, redis_server: Any, sql: Any) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return tokenyard(base_env, list(args))

    assert run("--version").stdout.startswith("tokenyard ")
    bare = run()
    assert bare.returncode == 0 and "teams" in bare.stdout and "keys" in bare.stdout
    helped = run("teams", "create", "--help").stdout
    assert "--kv-pages KV_PAGES" in helped and "KV-cache pages in flight" in helped
    assert "(default: unlimited)" in helped

    name = "ops-" + uuid.uuid4().hex[:6]
    assert run("teams", "create", name, "--rpm", "9").returncode == 0
    shown = json.loads(run("teams", "show", name, "--json").stdout)
    assert shown == [{**shown[0], "name": name, "rpm": 9}]
    key = run("keys", "create", "--team", name).stdout.strip().splitlines()[-1]
    listed = run("keys", "list", "--team", name, "--json")
    assert key not in listed.stdout  # prefixes only, never the secret
    assert [k["prefix"] for k in json.loads(listed.stdout)] == [key[:12]]

    client = gateway.client(key)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    cached = cache_key(hash_key(key))
    r = redis_server.client()
    r.set(cached, b"stale", ex=60)  # as another gateway's lookup would have left it
    assert run("teams", "update", name, "--rpm", "10").returncode == 0
    assert not r.exists(cached)  # an update drops the team's cached lookups

    deleted = run("teams", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    assert run("teams", "show", name).returncode == 1
    assert not r.exists(cached)
    wait_until(lambda: _refused(client), 3, "the deleted team's key to stop working")


def _refused(client: openai.OpenAI) -> bool:
    try:
        client.models.list()
    except openai.AuthenticationError:
        return True
    return False


def test_settings_warn_of_unknown_variables_and_refuse_them_when_strict(base_env: dict) -> None:
    env = {**base_env, "TOKENYARD_GATEWAY_PROT": "9000"}  # a typo
    code = "from tokenyard.core.settings import get_settings; get_settings()"
    warned = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert warned.returncode == 0
    assert "TOKENYARD_GATEWAY_PROT (did you mean TOKENYARD_GATEWAY_PORT?)" in warned.stderr
    strict = {**env, "TOKENYARD_STRICT_SETTINGS": "true"}
    refused = subprocess.run([sys.executable, "-c", code], env=strict, capture_output=True)
    assert refused.returncode != 0 and b"UnknownSetting" in refused.stderr


def test_secrets_never_show_in_a_repr() -> None:
    settings = Settings(admin_password="hunter2", redis_url="redis://:pw@h:6379", metrics_key="k1")
    shown = repr(settings)
    assert "hunter2" not in shown and ":pw@" not in shown and "k1'" not in shown
    assert settings.admin_password.get_secret_value() == "hunter2"


def test_an_env_file_is_read_below_the_environment(tmp_path: Any, monkeypatch: Any) -> None:
    (tmp_path / ".env").write_text("TOKENYARD_GATEWAY_PORT=8123\nTOKENYARD_ENGINE_PORT=8124\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENYARD_ENGINE_PORT", "8200")
    monkeypatch.delenv("TOKENYARD_GATEWAY_PORT", raising=False)
    settings = Settings()
    assert (settings.gateway_port, settings.engine_port) == (8123, 8200)


def test_each_request_gets_one_access_log_line(gateway: Any, team: Any) -> None:
    name, key = team()
    raw = gateway.client(key).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=3
    )
    lost = httpx.get(gateway.url + "/v1/nowhere?secret=1", headers={"authorization": "Bearer x"})
    ids = {raw.headers["x-request-id"]: 200, lost.headers["x-request-id"]: 404}

    def lines() -> dict[str, dict]:
        found = {}
        # split on newlines only: a fuzzed path may hold U+2028 and the like, which JSON keeps
        # raw and str.splitlines() would also split on
        for line in gateway.log.read_text().split("\n"):
            if "tokenyard.access" in line:
                entry = json.loads(line[line.index("{") :])
                found[entry["request_id"]] = entry
        return found

    wait_until(lambda: ids.keys() <= lines().keys(), 5, "access log lines")
    served, refused = (lines()[i] for i in ids)
    assert (served["status"], served["team"], served["model_served"]) == (200, name, MODEL)
    assert served["completion_tokens"] == 3 and served["latency_ms"] > 0
    assert (refused["status"], refused["path"]) == (404, "/v1/nowhere")  # no query string
    assert key not in gateway.log.read_text()
