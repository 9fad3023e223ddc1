"""What a hostile team can send, against a real gateway and the fake upstream: nothing it sends
reaches another team's requests, escapes its quotas or its bill, or crashes the gateway."""

import time
import uuid
from typing import Any

import httpx
import pytest
import sqlmodel
from sqlmodel import Session

from tests.gateway.conftest import MODEL, reservations, upstream_stats, wait_until
from tokenyard.billing.models import UsageRecord


def _post(gateway: Any, key: str, path: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    return httpx.post(
        gateway.url + path,
        content=content,
        json=None if content is not None else body,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def _error(reply: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error["message"], str) and error["type"]
    if code is not None:
        assert error["code"] == code
    return error


def test_a_request_id_cannot_smuggle_a_request_upstream(
    gateway: Any, team: Any, upstream: str
) -> None:
    _, key = team()
    smuggled = "x\r\ncontent-length: 0\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nx-tenant: other"
    before = upstream_stats(upstream)["requests"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    reply = _post(gateway, key, "/v1/chat/completions", {**body, "request_id": smuggled})
    assert _error(reply, 400, "invalid_request_id")["param"] == "request_id"
    too_long = _post(gateway, key, "/v1/chat/completions", body, **{"x-request-id": "r" * 129})
    assert _error(too_long, 400, "invalid_request_id")["param"] == "x-request-id"
    assert upstream_stats(upstream)["requests"] == before  # nothing went upstream


def test_a_reused_request_id_is_billed_every_time(gateway: Any, team: Any, sql: Any) -> None:
    """Five requests naming one client id are five records under the gateway's own ids, so a team
    can neither go unbilled by reusing an id nor suppress another team's records by guessing."""
    name, key = team()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 3}
    ids = set()
    for _ in range(5):
        reply = _post(gateway, key, "/v1/chat/completions", body, **{"x-request-id": "same-id"})
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-client-request-id"] == "same-id"
        ids.add(reply.headers["x-request-id"])
    assert len(ids) == 5

    def recorded() -> list[UsageRecord]:
        with Session(sql) as session:
            return list(session.exec(sqlmodel.select(UsageRecord).where(UsageRecord.team == name)))

    wait_until(lambda: len(recorded()) == 5, 20, "five usage records")
    rows = recorded()
    assert {r.request_id for r in rows} == ids
    assert {r.client_request_id for r in rows} == {"same-id"}


def test_one_teams_prompt_lists_never_refuse_another_team(gateway: Any, team: Any) -> None:
    """A list of prompts reports the tokens of all of them: learning the prompt overhead from it
    (against the largest prompt alone) once grew the shared estimate until every team's short
    prompt failed with context_length_exceeded."""
    _, key_a = team()
    _, key_b = team()
    prompts = [" ".join(["word"] * 60) for _ in range(100)]
    for _ in range(4):
        reply = _post(
            gateway, key_a, "/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": 2}
        )
        assert reply.status_code == 200, reply.text
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500}
    reply = _post(gateway, key_b, "/v1/chat/completions", chat)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("limits", "code"),
    [({"tokens_per_day": 1000}, "tokens_per_day"), ({"kv_pages": 40}, "kv_pages")],
)
def test_a_list_of_prompts_is_reserved_whole(
    gateway: Any, team: Any, redis_server: Any, upstream: str, limits: dict, code: str
) -> None:
    """20 prompts of ~200 tokens: reserving for the largest alone let a team limited to 1,000
    tokens a day (or 40 KV pages) run all of them in one request."""
    name, key = team(**limits)
    prompt = ["x" * 800 for _ in range(20)]  # ~200 tokens each, 4,000 in all
    before = upstream_stats(upstream)["requests"]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
    _error(_post(gateway, key, "/v1/completions", body), 429, code)
    assert upstream_stats(upstream)["requests"] == before
    one = _post(gateway, key, "/v1/completions", {**body, "prompt": prompt[:2]})
    assert one.status_code == 200, one.text
    r = redis_server.client()
    wait_until(lambda: reservations(r, name)["leases"] == 0, 5, "leases released")


def test_too_many_choices_are_refused(gateway: Any, team: Any) -> None:
    _, key = team()
    body = {"model": MODEL, "prompt": ["a"] * 40, "n": 4, "max_tokens": 1}
    assert _error(_post(gateway, key, "/v1/completions", body), 400)["param"] == "prompt"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "fake", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
    ids=["invalid-utf8", "nested-array", "nested-messages"],
)
def test_malformed_json_is_a_400(gateway: Any, team: Any, raw: bytes) -> None:
    _, key = team()
    for path in ("/v1/chat/completions", "/v1/completions"):
        _error(_post(gateway, key, path, raw, **{"content-type": "application/json"}), 400)


@pytest.mark.parametrize("model", [MODEL, "auto"])
def test_a_content_part_whose_text_is_not_a_string_is_a_400(
    gateway: Any, team: Any, redis_server: Any, model: str
) -> None:
    name, key = team()
    parts = [{"type": "text", "text": {"nested": ["not", "a", "string"]}}]
    body = {"model": model, "messages": [{"role": "user", "content": parts}]}
    assert _error(_post(gateway, key, "/v1/chat/completions", body), 400)["param"] == "messages"
    assert reservations(redis_server.client(), name)["leases"] == 0


def test_client_ids_never_collide_across_teams(gateway: Any, team: Any, upstream: str) -> None:
    """Two teams naming the same id get distinct ids upstream (the engine refuses a second request
    under an id in flight, so a guessed id could otherwise fail another team's request)."""
    _, key_a = team()
    _, key_b = team()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    seen = []
    shared = "shared-" + uuid.uuid4().hex[:6]
    for key in (key_a, key_b):
        _post(gateway, key, "/v1/chat/completions", body, **{"x-request-id": shared})
        seen.append(upstream_stats(upstream)["last_headers"]["x-request-id"])
        time.sleep(0.01)
    assert seen[0] != seen[1] and all(s.startswith("req-") for s in seen)
