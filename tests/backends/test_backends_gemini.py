"""Google's Gemini API as a backend, against the fake Gemini (proven with the `google-genai` SDK in
test_backends_gemini_fake.py): Google AI Studio with a key, Vertex AI with a service account's
token; replies, streams, tool calls whose thought signatures Gemini 3 requires back, thinking
tokens, Gemini's own safety blocks, and the faults the retry layer handles."""

import base64
import json
import struct
from typing import Any

import msgspec
import pytest

from tests.backends.conftest import KEY_ENV, control, stats
from tests.backends.test_backends_openai import call, events, read_stream
from tokenyard.backends.base import BackendUnavailable, UpstreamBroken, UpstreamCall
from tokenyard.core.errors import GatewayError
from tokenyard.router.catalog import Catalog, CatalogError, CatalogFile, DeploymentEntry, ModelEntry

CHAT = "/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
def gemini(build_entry: Any, gemini_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """gemini(model): a backend of that Gemini model at the fake's AI Studio, with a key."""
    monkeypatch.setenv(KEY_ENV, "gm-test-key")
    control(gemini_url, reset=True)

    def make(model: str = "gemini-2.5-flash", **settings: Any) -> Any:
        entry = ModelEntry(
            id="gem",
            provider="gemini",
            upstream_model=model,
            base_urls=(gemini_url + "/v1beta",),
            api_key_env=KEY_ENV,
        )
        return build_entry(entry, **settings)

    return make


def _asked(messages: list[dict[str, Any]], **extra: Any) -> UpstreamCall:
    body = {"model": "gem", "messages": messages, "max_tokens": 16, **extra}
    return UpstreamCall(CHAT, json.dumps(body).encode(), {"x-tenant": "team-a"})


def _text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_ai_studio_answers_streams_and_counts_with_its_key(gemini: Any, gemini_url: str):
    upstream = gemini()
    reply = await upstream.complete(call("hello there #chunks=3"))
    assert reply.status == 200
    body = msgspec.json.decode(reply.body)
    assert body["model"] == "gem" and body["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 3
    seen = stats(gemini_url)
    assert (seen["cloud"], seen["model"], seen["verb"]) == (
        "studio",
        "gemini-2.5-flash",
        "generateContent",
    )
    assert seen["key"] == "gm-test-key" and seen["last_body"]["generationConfig"] == {
        "maxOutputTokens": 16
    }
    streamed = call("hello #chunks=4", stream=True, stream_options={"include_usage": True})
    chunks = events(await read_stream(upstream, streamed))
    assert _text(chunks) == "w0 w1 w2 w3 "
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["model"] == "gem" for c in chunks)
    assert (stats(gemini_url)["verb"], stats(gemini_url)["query"]) == (
        "streamGenerateContent",
        "alt=sse",
    )
    counted = await upstream.count_tokens(call("one two three"))
    assert counted is not None and msgspec.json.decode(counted.body) == {"input_tokens": 3}
    assert stats(gemini_url)["verb"] == "countTokens"
    with pytest.raises(GatewayError) as refused:  # Gemini has no text completions
        await upstream.complete(call("hi", path="/v1/completions"))
    assert refused.value.status == 400 and refused.value.code == "unsupported_endpoint"


async def test_gemini_3_tool_calls_come_back_with_their_signatures(gemini: Any, gemini_url: str):
    """Gemini 3 refuses a history whose function calls lost their thought signatures: the
    signature rides in the tool call's id, which OpenAI's clients send back untouched."""
    upstream = gemini("gemini-3-pro-preview")
    ask = [{"role": "user", "content": "weather in Paris? #tool"}]
    reply = msgspec.json.decode((await upstream.complete(_asked(ask, tools=[WEATHER]))).body)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    answer = {"role": "tool", "tool_call_id": tool_call["id"], "content": '{"temp": 21}'}
    history = [*ask, choice["message"], answer]
    follow = await upstream.complete(_asked(history, tools=[WEATHER]))
    assert follow.status == 200, follow.body
    sent = stats(gemini_url)["last_body"]["contents"]
    assert sent[1]["parts"][-1]["thoughtSignature"]  # restored from the id
    assert sent[2]["parts"][0]["functionResponse"] == {
        "name": "weather",
        "response": {"temp": 21},
    }
    # a signature that is not Gemini's: refused, in OpenAI's shape
    forged = tool_call["id"].split("~sig~")[0] + "~sig~Zm9yZ2Vk"
    bad = {**choice["message"], "tool_calls": [{**tool_call, "id": forged}]}
    refused = await upstream.complete(
        _asked([*ask, bad, {**answer, "tool_call_id": forged}], tools=[WEATHER])
    )
    error = msgspec.json.decode(refused.body)["error"]
    assert refused.status == 400 and error["code"] == "INVALID_ARGUMENT"
    assert "thought signature" in error["message"].lower()
    # a call another model made (a conversation that fell back to Gemini): no signature to give,
    # so Google's placeholder goes in its place and Gemini 3 takes the history
    elsewhere = {**choice["message"], "tool_calls": [{**tool_call, "id": "call_from_gpt"}]}
    moved = [*ask, elsewhere, {**answer, "tool_call_id": "call_from_gpt"}]
    taken = await upstream.complete(_asked(moved, tools=[WEATHER]))
    assert taken.status == 200, taken.body
    call_part = stats(gemini_url)["last_body"]["contents"][1]["parts"][-1]
    assert call_part["thoughtSignature"] == "skip_thought_signature_validator"
    assert call_part["functionCall"]["id"] == "call_from_gpt"  # not made here: sent back
    # streamed: the call arrives whole, with its signed id, and the reply ends tool_calls
    streamed = _asked(ask, tools=[WEATHER], stream=True)
    chunks = events(await read_stream(upstream, streamed))
    calls = [
        d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "weather"
    assert calls[0]["id"].split("~sig~")[1] == tool_call["id"].split("~sig~")[1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_thinking_is_output_and_not_the_answer(gemini: Any) -> None:
    reply = msgspec.json.decode((await gemini().complete(call("think #thoughts=7 #chunks=2"))).body)
    assert reply["choices"][0]["message"]["content"] == "w0 w1 "
    usage = reply["usage"]
    assert usage["completion_tokens"] == 9
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 7


async def test_geminis_own_safety_blocks_and_filters(gemini: Any) -> None:
    upstream = gemini()
    refused = await upstream.complete(call("something bad #blocked"))
    error = msgspec.json.decode(refused.body)["error"]
    assert refused.status == 400 and error["code"] == "content_policy_violation"
    stream = await upstream.open_stream(call("something bad #blocked", stream=True))
    assert stream.status == 400
    assert json.loads(await stream.read_all())["error"]["code"] == "content_policy_violation"
    filtered = msgspec.json.decode((await upstream.complete(call("edgy #finish=SAFETY"))).body)
    assert filtered["choices"][0]["finish_reason"] == "content_filter"
    cut_short = msgspec.json.decode((await upstream.complete(call("long #finish=MAX_TOKENS"))).body)
    assert cut_short["choices"][0]["finish_reason"] == "length"


async def test_refusals_retries_and_broken_streams(gemini: Any, gemini_url: str) -> None:
    upstream = gemini()
    once = await upstream.complete(call("busy #status=429 #times=1"))
    assert once.status == 200  # retried after Google's 429
    denied = await upstream.complete(call("no #status=403"))
    error = msgspec.json.decode(denied.body)["error"]
    assert denied.status == 403 and error["type"] == "permission_error"
    assert error["code"] == "PERMISSION_DENIED"
    control(gemini_url, reset=True)
    with pytest.raises(BackendUnavailable):  # an error in place of the first event, every try
        await upstream.open_stream(call("overloaded #stream_error=0", stream=True))
    assert stats(gemini_url)["requests"] == 3
    stream = await upstream.open_stream(call("breaks #stream_error=2 #chunks=5", stream=True))
    with pytest.raises(UpstreamBroken):
        async for _ in stream.chunks():
            pass
    await stream.aclose()
    stream = await upstream.open_stream(call("cut #cut=2 #chunks=5", stream=True))
    with pytest.raises(UpstreamBroken):
        async for _ in stream.chunks():
            pass
    await stream.aclose()


async def test_vertex_serves_gemini_with_a_service_accounts_token(
    build_entry: Any, gemini_url: str, service_account: str
) -> None:
    control(gemini_url, reset=True)
    vertex = DeploymentEntry(
        base_url=f"{gemini_url}/v1/projects/proj/locations/europe-west4", provider="vertex"
    )
    entry = ModelEntry(
        id="gem", provider="gemini", upstream_model="gemini-2.5-pro", deployments=(vertex,)
    )
    assert entry.configured  # Google Cloud's credentials, found at the first request
    upstream = build_entry(entry)
    reply = await upstream.complete(call("hi #chunks=2"))
    assert msgspec.json.decode(reply.body)["choices"][0]["message"]["content"] == "w0 w1 "
    seen = stats(gemini_url)
    assert (seen["cloud"], seen["project"], seen["region"]) == ("vertex", "proj", "europe-west4")
    assert seen["model"] == "gemini-2.5-pro" and seen["token"].startswith("ya29.fake.")
    chunks = events(await read_stream(upstream, call("hi #chunks=2", stream=True)))
    assert _text(chunks) == "w0 w1 "
    counted = await upstream.count_tokens(call("one two"))
    assert counted is not None and msgspec.json.decode(counted.body) == {"input_tokens": 2}


def test_catalog_takes_gemini_at_ai_studio_and_vertex_only() -> None:
    vertex = DeploymentEntry(
        base_url="https://europe-west4-aiplatform.googleapis.com/v1/x", provider="vertex"
    )
    Catalog(CatalogFile(models=(ModelEntry(id="g", provider="gemini", deployments=(vertex,)),)))
    for wrong in ("openai", "bedrock", "anthropic"):
        other = DeploymentEntry(base_url="https://x.test", api_key_env="K", provider=wrong)  # type: ignore[arg-type]
        with pytest.raises(CatalogError, match="speaks"):
            Catalog(
                CatalogFile(models=(ModelEntry(id="g", provider="gemini", deployments=(other,)),))
            )
    keyless = ModelEntry(
        id="g", provider="gemini", base_urls=("https://generativelanguage.googleapis.com/v1beta",)
    )
    assert not keyless.configured  # AI Studio takes a key


async def test_structured_outputs_logprobs_and_candidates_reach_gemini(
    gemini: Any, gemini_url: str
) -> None:
    upstream = gemini()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "$defs": {}}
    shaped = call(
        "as json #chunks=2",
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert (await upstream.complete(shaped)).status == 200
    config = stats(gemini_url)["last_body"]["generationConfig"]
    assert config["responseJsonSchema"] == schema  # JSON Schema as it is, `$defs` and all
    scored = call("score #chunks=2", logprobs=True, top_logprobs=2, n=2)
    reply = msgspec.json.decode((await upstream.complete(scored)).body)
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    tokens = reply["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 2 and all(len(t["top_logprobs"]) == 2 for t in tokens)


async def test_gemini_embeddings_at_ai_studio_and_vertex(
    build_entry: Any, gemini_url: str, service_account: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI's embeddings request to a Gemini embedding model: AI Studio's batchEmbedContents
    (usage estimated: it counts none), Vertex AI's predict (its own token counts); `dimensions`
    and base64 vectors; token ids and streaming refused."""
    monkeypatch.setenv(KEY_ENV, "gm-key")
    control(gemini_url, reset=True)
    studio = ModelEntry(
        id="embed",
        provider="gemini",
        kind="embedding",
        upstream_model="gemini-embedding-001",
        base_urls=(gemini_url + "/v1beta",),
        api_key_env=KEY_ENV,
    )
    vertex = DeploymentEntry(
        base_url=f"{gemini_url}/v1/projects/proj/locations/us-central1", provider="vertex"
    )
    on_vertex = msgspec.structs.replace(studio, base_urls=(), api_key_env="", deployments=(vertex,))
    texts = ["one small text", "two"]
    body = {"model": "embed", "input": texts, "dimensions": 4}
    asked = UpstreamCall("/v1/embeddings", json.dumps(body).encode(), {})
    for entry, cloud, tokens in ((studio, "studio", 5), (on_vertex, "vertex", 4)):
        reply = msgspec.json.decode((await build_entry(entry).complete(asked)).body)
        assert [d["index"] for d in reply["data"]] == [0, 1] and reply["model"] == "embed"
        assert len(reply["data"][0]["embedding"]) == 4
        assert reply["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        seen = stats(gemini_url)
        assert (seen["cloud"], seen["verb"]) == (
            cloud,
            "batchEmbedContents" if cloud == "studio" else "predict",
        )
    as_base64 = UpstreamCall(
        "/v1/embeddings", json.dumps({**body, "encoding_format": "base64"}).encode(), {}
    )
    packed = msgspec.json.decode((await build_entry(studio).complete(as_base64)).body)
    floats = struct.unpack("<4f", base64.b64decode(packed["data"][0]["embedding"]))
    plain = msgspec.json.decode((await build_entry(studio).complete(asked)).body)
    assert floats == pytest.approx(plain["data"][0]["embedding"], rel=1e-6)
    ids = UpstreamCall("/v1/embeddings", json.dumps({"input": [[1, 2, 3]]}).encode(), {})
    with pytest.raises(GatewayError) as refused:
        await build_entry(studio).complete(ids)
    assert refused.value.param == "input"
    (checked,) = await build_entry(studio).check("embedding")
    assert checked.ok, checked.error
