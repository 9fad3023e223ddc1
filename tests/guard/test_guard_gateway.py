"""The safety layer in a real gateway, against the fake upstream, through the official SDK:
a blocked prompt never reaches the client's stream (400 content_policy_violation, the upstream call
cancelled, nothing charged), a reply crossing the output policy ends with finish_reason
"content_filter", every flag and block is an audit row, policies are per team, and
/v1/moderations answers in OpenAI's shape, metered like any request."""

import json
from typing import Any

import httpx
import openai
import pytest
import sqlmodel
from google.genai import types
from sqlmodel import Session

from tests.gateway.conftest import (
    MODEL,
    day_tokens,
    reservations,
    tokenyard,
    upstream_stats,
    wait_until,
)
from tests.guard.conftest import Texts
from tests.openai_spec import problems
from tokenyard.billing.models import UsageRecord
from tokenyard.guard import store
from tokenyard.guard.models import GuardAudit
from tokenyard.guard.policy import DEFAULT, apply, parse_change

METRICS_KEY = "metrics-guard-test"


def _policy(sql: Any, team: str, *specs: str) -> None:
    store.write_policy(sql, team, apply(DEFAULT, [parse_change(s) for s in specs]))


def _audit(sql: Any, request_id: str) -> list[GuardAudit]:
    with Session(sql) as session:
        query = sqlmodel.select(GuardAudit).where(GuardAudit.request_id == request_id)
        return list(session.exec(query))


def _records(sql: Any, request_id: str) -> list[UsageRecord]:
    with Session(sql) as session:
        query = sqlmodel.select(UsageRecord).where(UsageRecord.request_id == request_id)
        return list(session.exec(query))


def _chat(text: str, directives: str = "", **extra: Any) -> dict[str, Any]:
    """The fake upstream's directives go in a system turn: the screened text is the user's."""
    messages = [{"role": "user", "content": text}]
    if directives:
        messages.insert(0, {"role": "system", "content": directives})
    return {"model": MODEL, "messages": messages, **extra}


@pytest.fixture(scope="module")
def gw(base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A gateway with a metrics key (to read the team-labelled guard counters)."""
    from tests.gateway.conftest import Gateway

    env = {**base_env, "TOKENYARD_METRICS_KEY": METRICS_KEY}
    gateway = Gateway(env, tmp_path_factory.mktemp("guard") / "gateway.log")
    yield gateway
    gateway.stop()


def test_blocked_prompt_never_reaches_the_stream(
    gw: Any, team: Any, sql: Any, redis_server: Any, upstream: str, texts: Texts
) -> None:
    name, key = team()
    _policy(sql, name, "input.*=block")
    # a warm connection to the upstream, as a running gateway has: the call goes out at once
    gw.client(key).chat.completions.create(**_chat(texts.benign), max_tokens=2)
    before = upstream_stats(upstream)
    tokens_before = day_tokens(redis_server.client(), name)
    # the upstream is slow (#delay): the verdict comes while it works, and cancels it
    body = _chat(texts.harmful, "#delay=0.2 #chunks=10", stream=True, max_tokens=10, user="mallory")
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
        raw = r.read()
    assert r.status_code == 400
    assert b"data:" not in raw  # not one event of the stream
    error = json.loads(raw)["error"]
    assert error["code"] == "content_policy_violation"
    assert error["type"] == "invalid_request_error"
    assert any(c in error["message"] for c in texts.harmful_categories)
    request_id = r.headers["x-request-id"]

    # the upstream call was made (in parallel with the check), then cancelled; the team is
    # charged nothing it did not use
    assert upstream_stats(upstream)["requests"] > before["requests"]
    wait_until(
        lambda: upstream_stats(upstream)["cancelled"] > before["cancelled"], 5, "upstream cancelled"
    )
    rc = redis_server.client()
    wait_until(lambda: reservations(rc, name)["leases"] == 0, 5, "lease released")
    assert day_tokens(rc, name) == tokens_before

    # the audit row: scores and categories, no text (the policy does not opt in)
    wait_until(lambda: _audit(sql, request_id), 10, "audit row")
    (row,) = _audit(sql, request_id)
    assert (row.team, row.direction, row.action, row.model) == (name, "input", "block", MODEL)
    assert set(row.categories.split(",")) & set(texts.harmful_categories)
    assert row.text is None
    assert max(json.loads(row.scores).values()) > 0.5
    # it names the end user the request was for: a team finds who sends what it blocks
    assert row.end_user == "mallory"
    assert [r.id for r in store.audit_rows(sql, team=name, end_user="mallory")] == [row.id]
    assert store.audit_rows(sql, team=name, end_user="someone-else") == []

    # the SDK sees OpenAI's error, whole or streamed
    client = gw.client(key)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(**_chat(texts.harmful), stream=stream, max_tokens=5)
        assert exc.value.code == "content_policy_violation"


def test_policies_are_per_team(gw: Any, team: Any, sql: Any, texts: Texts) -> None:
    """The same prompt: blocked for a team that blocks, answered (and flagged) for a team on the
    platform default, answered and never scored for a team that turned checks off."""
    blocking, blocking_key = team()
    _policy(sql, blocking, "input.*=block")
    default, default_key = team()
    off, off_key = team()
    _policy(sql, off, "input.*=off", "output.*=off")

    with pytest.raises(openai.BadRequestError):
        gw.client(blocking_key).chat.completions.create(**_chat(texts.harmful), max_tokens=3)
    reply = gw.client(default_key).chat.completions.with_raw_response.create(
        **_chat(texts.harmful), max_tokens=3
    )
    flagged_id = reply.headers["x-request-id"]
    assert reply.parse().choices[0].finish_reason == "length"
    wait_until(lambda: _audit(sql, flagged_id), 10, "flag row")
    assert _audit(sql, flagged_id)[0].action == "flag"
    reply = gw.client(off_key).chat.completions.with_raw_response.create(
        **_chat(texts.harmful), max_tokens=3
    )
    assert reply.parse().choices[0].finish_reason == "length"
    # a benign prompt is no audit row for the blocking team either
    reply = gw.client(blocking_key).chat.completions.with_raw_response.create(
        **_chat(texts.benign), max_tokens=3
    )
    assert reply.http_response.status_code == 200

    metrics = httpx.get(gw.url + "/metrics", headers={"authorization": f"Bearer {METRICS_KEY}"})
    lines = [ln for ln in metrics.text.splitlines() if ln.startswith("tokenyard_guard_outcomes")]
    assert any(f'team="{blocking}"' in ln and 'action="block"' in ln for ln in lines)
    assert any(f'team="{default}"' in ln and 'action="flag"' in ln for ln in lines)
    assert not any(f'team="{off}"' in ln for ln in lines)


def test_a_violating_stream_ends_with_content_filter(
    gw: Any, team: Any, sql: Any, texts: Texts
) -> None:
    name, key = team()
    _policy(sql, name, "input.*=off", "output.*=block")
    client = gw.client(key)
    # the fake upstream repeats the prompt's words (#echo) as its reply, 200 chunks of it
    prompt = texts.echoed + " #echo #chunks=200"
    chunks = list(client.chat.completions.create(**_chat(prompt), stream=True, max_tokens=200))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "content_filter"
    assert "length" not in finishes and "stop" not in finishes
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) < 200  # cut short, and said so

    # whole: the same reply, cut at the same rule, in the choice
    reply = client.chat.completions.with_raw_response.create(**_chat(prompt), max_tokens=200)
    completion = reply.parse()
    assert completion.choices[0].finish_reason == "content_filter"
    assert len((completion.choices[0].message.content or "").split()) < 200
    request_id = reply.headers["x-request-id"]
    wait_until(lambda: _audit(sql, request_id), 10, "output audit row")
    assert _audit(sql, request_id)[0].direction == "output"

    # a clean reply is untouched
    reply = client.chat.completions.create(**_chat(texts.benign, "#echo"), max_tokens=20)
    assert reply.choices[0].finish_reason == "length"


def test_store_text_is_opt_in(gw: Any, team: Any, sql: Any, texts: Texts) -> None:
    name, key = team()
    policy = apply(DEFAULT, [parse_change("input.*=block")], store_text=True)
    store.write_policy(sql, name, policy)
    with pytest.raises(openai.BadRequestError) as exc:
        gw.client(key).chat.completions.create(**_chat(texts.harmful), max_tokens=3)
    request_id = exc.value.response.headers["x-request-id"]
    wait_until(lambda: _audit(sql, request_id), 10, "audit row")
    assert texts.harmful in (_audit(sql, request_id)[0].text or "")


def test_moderations_through_the_sdk(gw: Any, team: Any, sql: Any, texts: Texts) -> None:
    name, key = team(rpm=3)
    client = gw.client(key)
    result = client.moderations.create(input=[texts.benign, texts.harmful])
    assert result.id.startswith("modr-") and len(result.results) == 2
    benign, harmful = result.results
    assert not benign.flagged and harmful.flagged
    scores = harmful.category_scores.model_dump(by_alias=True)
    flags = harmful.categories.model_dump(by_alias=True)
    for category in texts.harmful_categories:
        assert flags[category] is True and scores[category] > 0.0
    assert set(scores) >= {"sexual", "hate", "harassment", "self-harm", "violence", "illicit"}
    one = client.moderations.create(input=texts.benign, model="omni-moderation-latest")
    assert len(one.results) == 1 and not one.results[0].flagged
    # OpenAI's published schema of the answer (the vendored OpenAPI document)
    raw = httpx.post(
        gw.url + "/v1/moderations",
        json={"input": [texts.harmful, {"type": "text", "text": texts.benign}]},
        headers={"authorization": f"Bearer {key}"},
    )
    assert raw.status_code == 200 and raw.headers["x-ratelimit-limit-requests"] == "3"
    assert problems("CreateModerationResponse", raw.json()) == []

    # metered: rpm applies (3 a minute), and each call is a usage record
    with pytest.raises(openai.RateLimitError):
        for _ in range(2):
            client.moderations.create(input="hello")

    def records() -> list[UsageRecord]:
        with Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.team == name)
            return list(session.exec(query))

    wait_until(lambda: len(records()) >= 3, 20, "usage records")
    assert all(r.prompt_tokens > 0 and r.status == 200 for r in records())

    # bad input is an OpenAI error, not a crash
    for bad in ([], [{"type": "image_url", "image_url": {"url": "x"}}], [3]):
        with pytest.raises(openai.BadRequestError):
            gw.client(team()[1]).moderations.create(input=bad)  # type: ignore[arg-type]


def test_policy_cli_and_guard_off(start_gateway: Any, team: Any, base_env: dict[str, str]) -> None:
    name, key = team()
    run = ["guard", "policy"]
    out = tokenyard(base_env, [*run, "set", name, "input.violence=block@0.7", "--json"], check=True)
    rules = {(r["direction"], r["category"]): r for r in json.loads(out.stdout)["rules"]}
    assert rules[("input", "violence")]["action"] == "block"
    assert rules[("input", "violence")]["threshold"] == 0.7
    out = tokenyard(base_env, [*run, "set", name, "input.violence=destroy"])
    assert out.returncode == 1 and "action must be one of" in out.stderr
    terms = ["--term", "Project Falcon", "--term", " acme "]
    out = tokenyard(
        base_env,
        [*run, "set", name, "pii.email=mask", "pii.blocklist=block", *terms, "--json"],
        check=True,
    )
    shown = json.loads(out.stdout)
    assert shown["terms"] == ["Project Falcon", "acme"]
    pii = {r["category"]: r["action"] for r in shown["rules"] if r["direction"] == "pii"}
    assert (pii["email"], pii["blocklist"], pii["phone"]) == ("mask", "block", "off")
    assert shown["rules"][0]["direction"] == "input"  # the classifier's rules kept as they were
    out = tokenyard(base_env, [*run, "set", name, "--term", "", "--json"], check=True)
    assert json.loads(out.stdout)["terms"] == []

    off = start_gateway(guard_enabled="false")
    reply = httpx.post(
        off.url + "/v1/moderations",
        json={"input": "hello"},
        headers={"authorization": f"Bearer {key}"},
    )
    assert reply.status_code == 404


def test_odd_prompts_are_screened_never_a_500(gw: Any, team: Any, sql: Any) -> None:
    """Whatever a client sends as text reaches the classifier as text: empty, huge, binary-looking,
    other scripts, lone surrogates (valid JSON escapes), content parts."""
    name, key = team()
    _policy(sql, name, "input.*=block", "output.*=block")
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    contents: list[Any] = [
        "",
        "\x00\x01\x02" * 1000,
        "x" * 300_000,
        "这是一个普通的问题。",
        [{"type": "text", "text": "part one"}, {"type": "image_url", "image_url": {"url": "x"}}],
    ]
    for content in contents:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        reply = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert reply.status_code in (200, 400), reply.text
        assert reply.status_code == 200 or reply.json()["error"]["code"] != "internal_error"
    raw = (
        b'{"model": "fake", "max_tokens": 2, '
        b'"messages": [{"role": "user", "content": "\\ud800 a \\udfff"}]}'
    )
    reply = httpx.post(gw.url + "/v1/chat/completions", content=raw, headers=headers, timeout=30)
    assert reply.status_code in (200, 400), reply.text


def test_a_cached_answer_is_screened_under_the_teams_policy_now(
    start_gateway: Any, team: Any, sql: Any, texts: Texts
) -> None:
    """An answer the response cache kept is checked again when it is served: a prompt the team's
    policy blocks since is refused, and charged nothing."""
    gateway = start_gateway(gateway_cache_ttl_s="60")
    name, key = team()
    _policy(sql, name, "input.*=off", "output.*=off")
    client = gateway.client(key)
    ask = _chat(texts.harmful, max_tokens=4, temperature=0)
    assert client.chat.completions.with_raw_response.create(**ask).headers["x-tokenyard-cache"] == (
        "miss"
    )
    _policy(sql, name, "input.*=block")

    refusals: list[str] = []

    def refused() -> bool:
        try:
            client.chat.completions.create(**ask)
        except openai.BadRequestError as exc:
            assert exc.code == "content_policy_violation"
            refusals.append(exc.response.headers["x-request-id"])
            return True
        return False

    wait_until(refused, 10, "the new policy applied to the cached answer")
    request_id = refusals[-1]
    wait_until(lambda: _records(sql, request_id), 10, "the usage record")
    (record,) = _records(sql, request_id)
    assert record.cache_hit and record.status == 400
    assert (record.cost_usd, record.prompt_tokens, record.completion_tokens) == (0.0, 0, 0)


def test_a_cached_stream_is_checked_as_it_is_replayed(
    start_gateway: Any, team: Any, sql: Any, texts: Texts
) -> None:
    """A stream kept while the team's output check was off is cut with content_filter when it is
    replayed under a policy that blocks it; a stream the check cut is never kept."""
    gateway = start_gateway(gateway_cache_ttl_s="60")
    name, key = team()
    _policy(sql, name, "input.*=off", "output.*=off")
    client = gateway.client(key)

    def streamed(text: str, cap: int = 200) -> tuple[str, list[str | None], str]:
        """The cache header, the finish reasons and the request id of one streamed ask."""
        ask = _chat(text + " #echo #chunks=200", max_tokens=cap, temperature=0, stream=True)
        with client.chat.completions.with_streaming_response.create(**ask) as raw:
            finishes = [c.choices[0].finish_reason for c in raw.parse() if c.choices]
            return raw.headers["x-tokenyard-cache"], finishes, raw.headers["x-request-id"]

    cache, finishes, _ = streamed(texts.echoed)
    assert (cache, finishes[-1]) == ("miss", "length")
    _policy(sql, name, "output.*=block")
    cut: list[str] = []

    def replayed_and_cut() -> bool:
        cache, finishes, request_id = streamed(texts.echoed)
        assert cache == "hit"
        cut.append(request_id)
        return finishes[-1] == "content_filter" and "length" not in finishes

    wait_until(replayed_and_cut, 10, "the new policy applied to the cached stream")
    wait_until(lambda: _records(sql, cut[-1]), 10, "the usage record")
    (record,) = _records(sql, cut[-1])
    assert record.cache_hit and record.finish_reason == "content_filter"
    assert (record.cost_usd, record.completion_tokens) == (0.0, 0)

    # another ask (its own length cap), cut on its way from the upstream: not kept
    again = [streamed(texts.echoed, 199) for _ in range(2)]
    assert [(cache, finishes[-1]) for cache, finishes, _ in again] == [
        ("miss", "content_filter"),
        ("miss", "content_filter"),
    ]


def test_a_prompt_blocked_through_geminis_api_is_answered_as_gemini_does(
    gw: Any, team: Any, sql: Any, texts: Texts
) -> None:
    """Gemini answers a blocked prompt with no candidates and the reason, not with an error:
    what its clients check."""
    name, key = team()
    _policy(sql, name, "input.*=block")
    client = gw.gemini(key)
    reply = client.models.generate_content(model=MODEL, contents=texts.harmful)
    assert reply.prompt_feedback.block_reason == types.BlockedReason.SAFETY
    assert not reply.candidates and reply.text is None
    streamed = list(client.models.generate_content_stream(model=MODEL, contents=texts.harmful))
    assert [c.prompt_feedback.block_reason for c in streamed] == [types.BlockedReason.SAFETY]
    fine = client.models.generate_content(model=MODEL, contents=texts.benign + " #chunks=2")
    assert fine.text == "tok tok "
