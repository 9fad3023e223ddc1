"""Google's Gemini API over the catalog's models, with Google's own SDK (google-genai) against a
gateway on the fake upstream: text whole and streamed, function calls and their responses, JSON
output, token counts, the model list, and refusals in Google's error shape."""

import time
from typing import Any

import httpx
import pytest
from google.genai import errors, types

from tests.backends.test_backends_gemini_fake import MANUAL, WEATHER
from tests.gateway.conftest import Gateway, upstream_stats


def test_text_whole_and_what_reaches_the_model(gateway: Gateway, team: Any, upstream: str) -> None:
    client = gateway.gemini(team()[1])
    reply = client.models.generate_content(
        model="fake",
        contents="hello there #chunks=3 #stop",
        config=types.GenerateContentConfig(
            system_instruction="Be brief.",
            max_output_tokens=8,
            temperature=0.2,
            stop_sequences=["END"],
            labels={"feature": "search"},
        ),
    )
    assert reply.text == "tok tok tok "
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP  # type: ignore[index]
    usage = reply.usage_metadata
    assert usage is not None and (usage.prompt_token_count, usage.candidates_token_count) == (
        6,  # the fake counts the words of both turns
        3,
    )
    assert usage.total_token_count == 9 and reply.model_version == "fake"
    sent = upstream_stats(upstream)["last_body"]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there #chunks=3 #stop"},
    ]
    assert (sent["max_tokens"], sent["temperature"], sent["stop"]) == (8, 0.2, ["END"])


def test_text_streamed(gateway: Gateway, team: Any) -> None:
    client = gateway.gemini(team()[1])
    chunks = list(client.models.generate_content_stream(model="fake", contents="hi #chunks=4"))
    assert "".join(c.text or "" for c in chunks) == "tok " * 4
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS  # type: ignore[index]
    assert last.usage_metadata is not None and last.usage_metadata.candidates_token_count == 4


def test_a_function_call_then_its_response(gateway: Gateway, team: Any, upstream: str) -> None:
    client = gateway.gemini(team()[1])
    config = types.GenerateContentConfig(
        tools=[WEATHER],
        automatic_function_calling=MANUAL,
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(
                mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=["get_weather"]
            )
        ),
    )
    question = types.Content(role="user", parts=[types.Part(text="Weather in Paris?")])
    first = client.models.generate_content(model="fake", contents=[question], config=config)
    sent = upstream_stats(upstream)["last_body"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    parameters = sent["tools"][0]["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["properties"]["city"]["type"] == "string"
    call = first.function_calls[0]  # type: ignore[index]
    assert (call.name, call.args) == ("get_weather", {"city": "Paris"})
    answer = types.Part.from_function_response(name="get_weather", response={"temp": 21})
    follow_up = [question, first.candidates[0].content, types.Content(role="user", parts=[answer])]  # type: ignore[index]
    second = client.models.generate_content(
        model="fake", contents=follow_up, config=types.GenerateContentConfig(tools=[WEATHER])
    )
    assert second.text
    messages = upstream_stats(upstream)["last_body"]["messages"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": messages[1]["tool_calls"][0]["id"],
        "content": '{"temp": 21}',
    }
    streamed = list(
        client.models.generate_content_stream(model="fake", contents=[question], config=config)
    )
    calls = [c for chunk in streamed for c in chunk.function_calls or ()]
    assert [(c.name, c.args) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_json_output_asks_for_the_schema(gateway: Gateway, team: Any, upstream: str) -> None:
    client = gateway.gemini(team()[1])
    client.models.generate_content(
        model="fake",
        contents="a city #chunks=1",
        config=types.GenerateContentConfig(
            response_mime_type="application/json",
            response_schema=types.Schema(
                type=types.Type.OBJECT,
                properties={"name": types.Schema(type=types.Type.STRING, nullable=True)},
            ),
        ),
    )
    wanted = upstream_stats(upstream)["last_body"]["response_format"]
    assert wanted["type"] == "json_schema"
    assert wanted["json_schema"]["schema"]["properties"]["name"]["type"] == ["string", "null"]


def test_token_counts_and_models(gateway: Gateway, team: Any) -> None:
    client = gateway.gemini(team()[1])
    counted = client.models.count_tokens(model="fake", contents="one two three")
    assert counted.total_tokens == 3
    names = [m.name for m in client.models.list()]
    assert "models/fake" in names and "models/auto" in names
    model = client.models.get(model="fake")
    assert model.display_name == "fake" and "generateContent" in model.supported_actions  # type: ignore[operator]
    with pytest.raises(errors.ClientError) as missing:
        client.models.get(model="no-such-model")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"


def test_refusals_are_googles(gateway: Gateway, team: Any) -> None:
    stranger = gateway.gemini("ty-not-a-key")  # held: a dropped Client closes its connections
    with pytest.raises(errors.ClientError) as bad_key:
        stranger.models.generate_content(model="fake", contents="hi")
    assert (bad_key.value.code, bad_key.value.status) == (401, "UNAUTHENTICATED")
    client = gateway.gemini(team(rpm=1)[1])
    client.models.generate_content(model="fake", contents="hi #chunks=1")
    with pytest.raises(errors.ClientError) as limited:
        client.models.generate_content(model="fake", contents="hi #chunks=1")
    assert (limited.value.code, limited.value.status) == (429, "RESOURCE_EXHAUSTED")
    search = types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())])
    free = gateway.gemini(team()[1])
    with pytest.raises(errors.ClientError) as unsupported:
        free.models.generate_content(model="fake", contents="news?", config=search)
    assert unsupported.value.code == 400 and "googleSearch" in str(unsupported.value.message)
    raw = httpx.post(
        gateway.url + "/v1beta/models/fake:streamGenerateContent",  # without alt=sse
        headers={"x-goog-api-key": free._api_client.api_key},  # type: ignore[attr-defined]
        json={"contents": [{"parts": [{"text": "hi"}]}]},
    )
    assert raw.status_code == 400 and raw.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_a_context_cache_goes_before_the_requests_that_name_it(
    gateway: Gateway, team: Any, upstream: str
) -> None:
    """google-genai's caches: create, get, list, update the expiry, use in generateContent,
    delete; a team sees only its own, and what a cache holds cannot be set again."""
    client = gateway.gemini(team()[1])
    cache = client.caches.create(
        model="fake",
        config=types.CreateCachedContentConfig(
            contents=[types.Content(role="user", parts=[types.Part(text="a long manual #stop")])],
            system_instruction="Answer from the manual.",
            display_name="manual",
            ttl="300s",
        ),
    )
    assert cache.name and cache.name.startswith("cachedContents/") and cache.model == "models/fake"
    assert cache.display_name == "manual" and cache.usage_metadata is not None
    assert cache.usage_metadata.total_token_count and cache.expire_time and cache.create_time
    left = cache.expire_time - cache.create_time
    assert 299 <= left.total_seconds() <= 301
    reply = client.models.generate_content(
        model="fake",
        contents="what does it say?",
        config=types.GenerateContentConfig(cached_content=cache.name),
    )
    assert reply.text
    assert upstream_stats(upstream)["last_body"]["messages"] == [
        {"role": "system", "content": "Answer from the manual."},
        {"role": "user", "content": "a long manual #stop"},
        {"role": "user", "content": "what does it say?"},
    ]
    assert client.caches.get(name=cache.name).display_name == "manual"
    assert [c.name for c in client.caches.list()] == [cache.name]
    longer = client.caches.update(
        name=cache.name, config=types.UpdateCachedContentConfig(ttl="3600s")
    )
    assert longer.expire_time and longer.expire_time > cache.expire_time
    with pytest.raises(errors.ClientError) as again:  # the cache's instructions, set twice
        client.models.generate_content(
            model="fake",
            contents="x",
            config=types.GenerateContentConfig(cached_content=cache.name, system_instruction="no"),
        )
    assert again.value.code == 400
    stranger = gateway.gemini(team()[1])
    with pytest.raises(errors.ClientError) as hidden:
        stranger.caches.get(name=cache.name)
    assert hidden.value.code == 404
    with pytest.raises(errors.ClientError):
        stranger.models.generate_content(
            model="fake",
            contents="x",
            config=types.GenerateContentConfig(cached_content=cache.name),
        )
    client.caches.delete(name=cache.name)
    with pytest.raises(errors.ClientError) as gone:
        client.caches.get(name=cache.name)
    assert gone.value.code == 404 and list(client.caches.list()) == []
    brief = client.caches.create(
        model="fake", config=types.CreateCachedContentConfig(contents=["x"], ttl="0.5s")
    )
    time.sleep(0.7)  # Redis lets it expire by itself
    with pytest.raises(errors.ClientError) as expired:
        client.caches.get(name=brief.name or "")
    assert expired.value.code == 404 and list(client.caches.list()) == []
    for ttl in ("0s", "999999999s", "soon"):
        with pytest.raises(errors.ClientError) as refused:
            client.caches.create(
                model="fake", config=types.CreateCachedContentConfig(contents=["x"], ttl=ttl)
            )
        assert refused.value.code == 400, ttl
