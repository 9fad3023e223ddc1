"""Any model on Amazon Bedrock through its Converse API, as a backend, against the fake Bedrock's
Converse routes (proven with botocore's client in test_backends_converse_fake.py): requests signed
with the environment's AWS credentials, replies and streams, a tool round trip, Bedrock's
guardrails, refusals and broken streams."""

import json
from typing import Any

import msgspec
import pytest

from tests.backends.conftest import AWS_KEYS, KEY_ENV, control, stats
from tests.backends.fake_anthropic import THOUGHT, signature
from tests.backends.test_backends_gemini import WEATHER
from tests.backends.test_backends_openai import call, events, read_stream
from tokenyard.backends.base import BackendUnavailable, UpstreamBroken, UpstreamCall
from tokenyard.router.catalog import Catalog, CatalogError, CatalogFile, ModelEntry

MODEL = "us.meta.llama3-3-70b-instruct-v1:0"


@pytest.fixture
def converse(build_entry: Any, bedrock_url: str, aws_env: None) -> Any:
    control(bedrock_url, reset=True)
    return build_entry(_model("llama", MODEL, bedrock_url))


def _model(model_id: str, upstream: str, url: str, **extra: Any) -> ModelEntry:
    """A catalog entry on the fake Bedrock's Converse routes."""
    fields = {"region": "us-west-2", **extra}
    return ModelEntry(
        id=model_id,
        provider="bedrock-converse",
        upstream_model=upstream,
        base_urls=(url,),
        **fields,
    )


def _asked(messages: list[dict[str, Any]], **extra: Any) -> UpstreamCall:
    body = {"model": "llama", "messages": messages, "max_tokens": 16, **extra}
    return UpstreamCall("/v1/chat/completions", json.dumps(body).encode(), {"x-tenant": "t"})


async def test_converse_answers_and_streams_signed(converse: Any, bedrock_url: str) -> None:
    reply = await converse.complete(call("hello there #chunks=3 #cached=1"))
    body = msgspec.json.decode(reply.body)
    assert reply.status == 200 and body["model"] == "llama"
    assert body["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 4  # every prompt word, the cached one included
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    seen = stats(bedrock_url)
    assert (seen["model"], seen["verb"], seen["auth"], seen["region"]) == (
        MODEL,
        "converse",
        "sigv4",
        "us-west-2",
    )
    streamed = call("hi #chunks=4", stream=True, stream_options={"include_usage": True})
    chunks = events(await read_stream(converse, streamed))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "w0 w1 w2 w3 " and stats(bedrock_url)["verb"] == "converse-stream"
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert await converse.count_tokens(call("one two")) is None  # the gateway estimates


async def test_a_tool_round_trip_and_guardrails(converse: Any, bedrock_url: str) -> None:
    ask = [{"role": "user", "content": "weather in Paris? #tool"}]
    reply = msgspec.json.decode((await converse.complete(_asked(ask, tools=[WEATHER]))).body)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tool_call,) = choice["message"]["tool_calls"]
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Paris"}
    answer = {"role": "tool", "tool_call_id": tool_call["id"], "content": '{"temp": 21}'}
    then = [*ask, choice["message"], answer, {"role": "user", "content": "thanks"}]
    follow = await converse.complete(_asked(then, tools=[WEATHER]))
    assert follow.status == 200, follow.body  # the fake checks each result answers a call
    sent = stats(bedrock_url)["last_body"]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"][0]["toolResult"]["content"] == [{"json": {"temp": 21}}]
    streamed = events(await read_stream(converse, _asked(ask, tools=[WEATHER], stream=True)))
    deltas = [
        d
        for c in streamed
        if c["choices"]
        for d in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert json.loads("".join(d["function"]["arguments"] for d in deltas)) == {"city": "Paris"}
    guarded = await converse.complete(call("risky #stop=guardrail_intervened"))
    assert msgspec.json.decode(guarded.body)["choices"][0]["finish_reason"] == "content_filter"


async def test_claude_thinks_on_converse_and_its_signed_thinking_goes_back(
    build_entry: Any, bedrock_url: str, aws_env: None, converse: Any
) -> None:
    """Anthropic's thinking reaches a Claude model on Converse as additionalModelRequestFields
    (no temperature beside it); its reasoningContent comes back as reasoning_content and a signed
    thinking block, whole and streamed, and goes back before the tool call it led to (the fake
    checks the signature). A model that is not Claude refuses the field, as Bedrock does."""
    control(bedrock_url, reset=True)
    upstream = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
    claude = build_entry(_model("claude", upstream, bedrock_url))
    thinking = {"type": "enabled", "budget_tokens": 2000}
    ask = [{"role": "user", "content": "weather in Paris? #tool"}]
    asked = {"tools": [WEATHER], "max_tokens": 3000, "thinking": thinking}
    reply = msgspec.json.decode((await claude.complete(_asked(ask, **asked, temperature=0.5))).body)
    sent = stats(bedrock_url)["last_body"]
    assert sent["additionalModelRequestFields"] == {"thinking": thinking}
    assert "temperature" not in sent["inferenceConfig"]
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT
    (block,) = message["thinking_blocks"]
    assert block == {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)}
    answer = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "sunny"}
    follow = await claude.complete(_asked([*ask, message, answer], **asked))
    assert follow.status == 200, follow.body
    turn = stats(bedrock_url)["last_body"]["messages"][1]["content"]
    assert turn[0] == {
        "reasoningContent": {"reasoningText": {"text": THOUGHT, "signature": block["signature"]}}
    }
    forged = {**message, "thinking_blocks": [{**block, "thinking": "Else."}]}
    refused = await claude.complete(_asked([*ask, forged, answer], **asked))
    assert refused.status == 400 and b"signature" in refused.body

    streamed = events(await read_stream(claude, _asked(ask, **asked, stream=True)))
    deltas = [c["choices"][0]["delta"] for c in streamed if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert [d["thinking_blocks"] for d in deltas if "thinking_blocks" in d] == [[block]]
    assert any(d.get("tool_calls") for d in deltas)
    llama = await converse.complete(_asked(ask, **asked))
    assert llama.status == 400 and b"thinking" in llama.body


async def test_refusals_retries_and_broken_streams(converse: Any, bedrock_url: str) -> None:
    assert (await converse.complete(call("busy #status=429 #times=1"))).status == 200
    refused = await converse.complete(call("nope #status=400"))
    assert refused.status == 400
    assert msgspec.json.decode(refused.body)["error"]["type"] == "invalid_request_error"
    control(bedrock_url, reset=True)
    with pytest.raises(BackendUnavailable):  # an exception frame first, on every try
        await converse.open_stream(call("overloaded #stream_error=0", stream=True))
    assert stats(bedrock_url)["requests"] == 3
    for broken in ("#stream_error=3 #chunks=5", "#cut=2 #chunks=5"):
        stream = await converse.open_stream(call(broken, stream=True))
        with pytest.raises(UpstreamBroken):
            async for _ in stream.chunks():
                pass
        await stream.aclose()


async def test_a_bedrock_api_key_signs_nothing(
    build_entry: Any, bedrock_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, AWS_KEYS["api_key"])
    entry = _model(
        "nova", "amazon.nova-pro-v1:0", bedrock_url, region="us-east-1", api_key_env=KEY_ENV
    )
    reply = await build_entry(entry).complete(call("hi #chunks=1"))
    assert reply.status == 200 and stats(bedrock_url)["auth"] == "bearer"


def test_converse_needs_its_region() -> None:
    entry = ModelEntry(id="l", provider="bedrock-converse", base_urls=("https://x.test",))
    with pytest.raises(CatalogError, match="region"):
        Catalog(CatalogFile(models=(entry,)))


async def test_a_json_answer_through_converse(converse: Any, bedrock_url: str) -> None:
    wanted = {"type": "json_object"}
    reply = msgspec.json.decode(
        (await converse.complete(call("where? #chunks=1", response_format=wanted))).body
    )
    assert json.loads(reply["choices"][0]["message"]["content"]) == {"city": "Paris"}
    assert reply["choices"][0]["finish_reason"] == "stop"
    choice = stats(bedrock_url)["last_body"]["toolConfig"]["toolChoice"]
    assert choice == {"tool": {"name": "json_answer"}}
    streamed = events(
        await read_stream(converse, call("where? #chunks=1", stream=True, response_format=wanted))
    )
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"])
    assert json.loads(text) == {"city": "Paris"}
