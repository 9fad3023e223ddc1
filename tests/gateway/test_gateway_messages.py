"""POST /v1/messages with the official Anthropic SDK, unchanged: any catalog model (here the fake
engine) answers Anthropic's clients, whole and streamed, tools included, through the same walk as
chat completions (keys, quotas, `auto`, settling), with Anthropic's event sequence and errors."""

from typing import Any

import anthropic
import httpx
import pytest

from tests.gateway.conftest import MODEL, upstream_stats, wait_until

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
USER = [{"role": "user", "content": "what is up"}]


def _client(gateway: Any, key: str, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, max_retries=0, **{"api_key": key, **kwargs})


def test_message_whole_and_billed(gateway: Any, team: Any, upstream: str) -> None:
    _, key = team()
    client = _client(gateway, key)  # the key as x-api-key, as the SDK sends it
    message = client.messages.create(
        model=MODEL, max_tokens=5, system="be brief", messages=USER, temperature=0.5
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "tok " * 5
    assert message.stop_reason == "max_tokens"  # the fake engine stops on length
    # the fake counts the words of the system prompt and the turn: 2 + 3
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 5)
    sent = upstream_stats(upstream)["last_body"]
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["temperature"] == 0.5 and sent["max_tokens"] == 5

    # a bearer key works too (the SDK's auth_token), and the usage lands in the team's records
    bearer = anthropic.Anthropic(base_url=gateway.url, auth_token=key, api_key=None, max_retries=0)
    raw = bearer.messages.with_raw_response.create(model=MODEL, max_tokens=3, messages=USER)
    assert raw.headers["request-id"] == raw.headers["x-request-id"]
    assert raw.parse().usage.output_tokens == 3

    def usage() -> dict[str, Any]:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.get(gateway.url + "/v1/usage", headers=headers).json()

    wait_until(lambda: usage()["requests"] == 2, 5, "both messages recorded")
    assert usage()["models"][MODEL]["completion_tokens"] == 8


def test_stream_has_anthropics_event_sequence(gateway: Any, team: Any) -> None:
    _, key = team()
    client = _client(gateway, key)
    events = list(client.messages.create(model=MODEL, max_tokens=3, messages=USER, stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[-2].delta.stop_reason == "max_tokens"
    assert events[-2].usage.output_tokens == 3 and events[-2].usage.input_tokens == 3

    with client.messages.stream(model="auto", max_tokens=4, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok " * 4 and final.content[0].text == text
    assert final.model == MODEL  # auto's pick, named as the model that served
    assert final.usage.output_tokens == 4 and final.stop_reason == "max_tokens"


def test_tools_whole_streamed_and_a_tool_result_turn(
    gateway: Any, team: Any, upstream: str
) -> None:
    _, key = team()
    client = _client(gateway, key)
    choice = {"type": "tool", "name": "get_weather"}
    message = client.messages.create(
        model=MODEL, max_tokens=20, messages=USER, tools=[WEATHER], tool_choice=choice
    )
    sent = upstream_stats(upstream)["last_body"]
    assert sent["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert message.stop_reason == "tool_use"
    (use,) = message.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}

    with client.messages.stream(
        model=MODEL, max_tokens=20, messages=USER, tools=[WEATHER]
    ) as stream:
        final = stream.get_final_message()
    (streamed,) = final.content
    assert streamed.type == "tool_use" and streamed.input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"

    history = [
        *USER,
        {"role": "assistant", "content": [use.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    answer = client.messages.create(model=MODEL, max_tokens=2, messages=history, tools=[WEATHER])
    assert answer.content[0].type == "text" and answer.stop_reason == "max_tokens"
    turns = upstream_stats(upstream)["last_body"]["messages"]
    assert turns[1]["tool_calls"][0]["id"] == use.id
    assert turns[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert turns[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}


def test_errors_are_anthropics(gateway: Any, team: Any) -> None:
    with pytest.raises(anthropic.AuthenticationError) as err:
        _client(gateway, "ty-nope").messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "authentication_error"

    _, key = team(rpm=1)
    client = _client(gateway, key)
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
    bad = [
        {"model": MODEL, "messages": USER},  # no max_tokens
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "x"}]}],
        },
    ]
    for body in bad:
        reply = httpx.post(gateway.url + "/v1/messages", json=body, headers={"x-api-key": key})
        assert reply.status_code == 400, body
        assert reply.json()["error"]["type"] == "invalid_request_error"
    # an upstream's refusal, translated
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "#status=400"}]
        )
    assert err.value.body["error"] == {"type": "invalid_request_error", "message": "refused"}
    with pytest.raises(anthropic.RateLimitError) as err:
        client.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert err.value.body["error"]["type"] == "rate_limit_error"
    assert err.value.response.headers["x-tokenyard-limit"] == "requests_per_minute"


def test_models_in_anthropics_shape_for_anthropics_client(gateway: Any, team: Any) -> None:
    """Anthropic's SDK lists and reads models in its own shape (it sends anthropic-version and the
    key as x-api-key); OpenAI's clients keep OpenAI's."""
    _, key = team()
    client = _client(gateway, key)
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert MODEL in ids and ids[-1] == "auto"
    assert all(m.type == "model" and m.display_name == m.id for m in listed.data)
    first = client.models.list(limit=1)
    assert [m.id for m in first.data] == ids[:1] and first.has_more
    rest = client.models.list(limit=1000, after_id=first.last_id)
    assert [m.id for m in rest.data] == ids[1:] and not rest.has_more
    back = client.models.list(limit=1, before_id=ids[-1])
    assert [m.id for m in back.data] == ids[-2:-1]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("no-such-model")
    openai_cards = httpx.get(gateway.url + "/v1/models", headers={"x-api-key": key}).json()
    assert openai_cards["object"] == "list"  # no anthropic-version: OpenAI's shape
    # the key as x-api-key, on every team route: past the key check to the body's own
    for path, body, status in (
        ("/v1/moderations", {"input": "hi"}, 200),
        ("/v1/feedback", {}, 400),
    ):
        answer = httpx.post(gateway.url + path, json=body, headers={"x-api-key": key})
        assert answer.status_code == status, (path, answer.text)
