"""The OpenAI backend against the fake OpenAI server: pass-through, renaming, and the faults the
retry layer handles (5xx, 429 + Retry-After, refused connections, timeouts, a stream cut)."""

import json
import time

import msgspec
import pytest

from tests.backends.conftest import control, free_port, stats
from tokenyard.backends.base import BackendUnavailable, UpstreamBroken, UpstreamCall
from tokenyard.backends.openai import request_body

CHAT = "/v1/chat/completions"


def call(content: str, path: str = CHAT, **extra: object) -> UpstreamCall:
    body: dict[str, object] = {"model": "m", "max_tokens": 16, **extra}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": content}]
    else:
        body["prompt"] = content
    return UpstreamCall(path, json.dumps(body).encode(), {"x-tenant": "team-a"})


async def read_stream(upstream, c: UpstreamCall) -> bytes:
    stream = await upstream.open_stream(c)
    try:
        return b"".join([chunk async for chunk in stream.chunks()])
    finally:
        await stream.aclose()


def events(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


def test_request_body_drops_platform_and_vllm_fields_and_renames_the_model():
    body = {
        "model": "gpt-mini-catalog-id",
        "messages": [],
        "tier": "batch",
        "priority": "batch",
        "request_id": "r1",
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "ignore_eos": True,
        "thinking": {"type": "disabled"},
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 2,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_object"},
    }
    out = msgspec.json.decode(request_body(body, "gpt-4o-mini"))
    assert out["model"] == "gpt-4o-mini"
    assert set(out) == {"model", "messages", "seed", "logprobs", "top_logprobs", "tools"} | {
        "response_format"
    }


async def test_chat_reply_passes_through_with_the_catalog_model_name(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"], model_id="gpt-mini")
    reply = await upstream.complete(call("hello #chunks=3", seed=1, top_k=4, tier="batch"))
    assert reply.status == 200
    body = json.loads(reply.body)
    assert body["model"] == "gpt-mini"
    assert body["choices"][0]["message"]["content"] == "w0 w1 w2 "
    seen = stats(openai_url)
    assert seen["last_body"]["model"] == "gpt-4o-mini"
    assert seen["last_body"]["seed"] == 1
    assert seen["last_headers"]["authorization"] == "Bearer sk-test-secret"
    assert "x-tenant" not in seen["last_headers"]


async def test_stream_renames_every_chunk_and_keeps_the_usage_chunk(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"], model_id="gpt-mini")
    c = call("hi #chunks=4", stream=True, stream_options={"include_usage": True})
    raw = await read_stream(upstream, c)
    chunks = events(raw)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert {c["model"] for c in chunks} == {"gpt-mini"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == (
        "w0 w1 w2 w3 "
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_completions_and_tool_calls_pass_through(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    reply = await upstream.complete(call("once upon #chunks=2", path="/v1/completions"))
    assert json.loads(reply.body)["choices"][0]["text"] == "w0 w1 "
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    reply = await upstream.complete(call("#tool", tools=tools, tool_choice="required"))
    choice = json.loads(reply.body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "weather"


async def test_5xx_is_retried_until_success(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    control(openai_url, reset=True)
    reply = await upstream.complete(call("flaky #status=500 #times=2"))
    assert reply.status == 200
    assert stats(openai_url)["requests"] == 3


async def test_429_retry_after_is_honoured(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    control(openai_url, reset=True)
    started = time.monotonic()
    reply = await upstream.complete(call("busy #status=429 #retry_after=1 #times=1"))
    waited = time.monotonic() - started
    assert reply.status == 200
    assert 1.0 <= waited < 1.8  # the Retry-After, not the 10 ms backoff
    assert stats(openai_url)["requests"] == 2


async def test_retry_after_is_capped(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"], backend_retry_after_max_s=0.2)
    started = time.monotonic()
    reply = await upstream.complete(call("capped #status=429 #retry_after=30 #times=1"))
    assert reply.status == 200
    assert time.monotonic() - started < 1.0


async def test_429_after_retries_is_a_rate_limited_backend_error(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    control(openai_url, reset=True)
    with pytest.raises(BackendUnavailable) as err:
        await upstream.complete(call("always busy #status=429 #retry_after=0"))
    assert err.value.status == 429 and err.value.code == "upstream_rate_limited"
    assert stats(openai_url)["requests"] == 3


async def test_4xx_is_returned_as_is_and_never_retried(make_upstream, openai_url):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    control(openai_url, reset=True)
    reply = await upstream.complete(call("bad #status=400"))
    assert reply.status == 400
    assert json.loads(reply.body)["error"]["type"] == "invalid_request_error"
    stream = await upstream.open_stream(call("bad #status=404", stream=True))
    assert stream.status == 404 and b"error" in await stream.read_all()
    assert stats(openai_url)["requests"] == 2


async def test_connection_refused_is_retried_then_unavailable(make_upstream):
    upstream = make_upstream("openai", [f"http://127.0.0.1:{free_port()}/v1"])
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as err:
        await upstream.complete(call("anyone?"))
    assert err.value.status == 503 and err.value.code == "upstream_unavailable"
    assert time.monotonic() - started < 1.0
    with pytest.raises(BackendUnavailable):
        await upstream.open_stream(call("anyone?", stream=True))


async def test_slow_first_byte_hits_the_first_token_timeout_and_is_retried(
    make_upstream, openai_url
):
    upstream = make_upstream("openai", [openai_url + "/v1"], backend_first_token_timeout_s=0.3)
    control(openai_url, reset=True)
    started = time.monotonic()
    raw = await read_stream(upstream, call("slow #first_byte_delay=1 #times=1", stream=True))
    assert b"[DONE]" in raw
    assert 0.3 <= time.monotonic() - started < 0.9  # gave up on the first after 0.3 s
    assert stats(openai_url)["requests"] == 2
    with pytest.raises(BackendUnavailable):
        await read_stream(upstream, call("always slow #first_byte_delay=1", stream=True))


async def test_read_timeout_before_any_byte_is_unavailable(make_upstream, openai_url):
    upstream = make_upstream(
        "openai", [openai_url + "/v1"], backend_read_timeout_s=0.2, backend_retry_attempts=2
    )
    control(openai_url, reset=True)
    with pytest.raises(BackendUnavailable):
        await upstream.complete(call("sleepy #delay=1"))
    assert stats(openai_url)["requests"] == 2


async def test_a_models_own_timeouts_and_tries_replace_the_platforms(make_upstream, openai_url):
    """The catalog's per-model waits and tries (LiteLLM's per-deployment timeout, stream_timeout,
    num_retries) win over the platform's settings; a model that sets none keeps those."""
    own = {"read_timeout_s": 0.2, "first_token_timeout_s": 0.2, "retry_attempts": 2}
    hasty = make_upstream("openai", [openai_url + "/v1"], own=own, backend_retry_attempts=3)
    control(openai_url, reset=True)
    with pytest.raises(BackendUnavailable):
        await hasty.complete(call("sleepy #delay=0.5"))
    assert stats(openai_url)["requests"] == 2
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await read_stream(hasty, call("slow #first_byte_delay=0.5", stream=True))
    assert time.monotonic() - started < 0.8  # two tries of 0.2 s, not the platform's 2 s
    patient = make_upstream("openai", [openai_url + "/v1"], model_id="p")
    assert (await patient.complete(call("sleepy #delay=0.5"))).status == 200
    raw = await read_stream(patient, call("slow #first_byte_delay=0.5", stream=True))
    assert b"[DONE]" in raw
    assert stats(openai_url)["requests"] == 6


async def test_a_stream_cut_mid_way_is_broken_never_retried_never_duplicated(
    make_upstream, openai_url
):
    upstream = make_upstream("openai", [openai_url + "/v1"])
    control(openai_url, reset=True)
    stream = await upstream.open_stream(call("cut #chunks=6 #cut=3", stream=True))
    received = []
    with pytest.raises(UpstreamBroken):
        async for chunk in stream.chunks():
            received.append(chunk)
    await stream.aclose()
    chunks = events(b"".join(received))
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": "", "refusal": None},
        {"content": "w0 "},
        {"content": "w1 "},
    ]
    assert stats(openai_url)["requests"] == 1
