"""The Responses API with the official SDK, over the fake upstream: function tools whole and
streamed, follow-up turns by previous_response_id, the streamed event sequence, team-scoped stored
responses (retrieve, delete, input_items), refusals; every object validated against OpenAI's
OpenAPI document."""

import json
import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Gateway, reservations, upstream_stats
from tests.openai_spec import problems
from tokenyard.tenancy import keys, teams

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
# the event types a streamed function call makes, in order (the fake streams its arguments in two
# pieces), and a streamed text answer of three chunks
CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 3,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def conforms(name: str, instance: Any) -> None:
    found = problems(name, instance)
    assert not found, f"{name}: {found[:5]}"


@pytest.fixture
def key(sql: Any) -> str:
    name = "resp-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    return keys.create_key(sql, name).key


def raw(capabilities_gw: Gateway, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=capabilities_gw.url, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def test_function_tool_then_its_output_by_previous_response_id(
    capabilities_gw: Gateway, key: str, upstream: str
) -> None:
    client = capabilities_gw.client(key)
    first = client.responses.create(
        model="fake",
        instructions="You answer about weather.",
        input="What is the weather in Paris? #chunks=3",
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        include=["reasoning.encrypted_content"],  # real clients send these: accepted
        prompt_cache_key="weather-agent",
        extra_body={"client_metadata": {"app": "test"}},
    )
    assert first.status == "completed" and first.model == "fake"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.usage and first.usage.input_tokens > 0
    sent = upstream_stats(upstream)["last_body"]
    assert sent["messages"][0] == {"role": "system", "content": "You answer about weather."}
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["tools"][0]["function"]["name"] == "get_weather"

    second = client.responses.create(
        model="fake",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}],
        tools=[TOOL],  # type: ignore[list-item]
    )
    assert second.status == "incomplete"  # the fake stops at max tokens ("length")
    assert second.previous_response_id == first.id
    assert second.output_text.startswith("tok")
    messages = upstream_stats(upstream)["last_body"]["messages"]
    # instructions are not carried over; the call and its output are
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21C"}

    with raw(capabilities_gw, key) as http:
        conforms("Response", http.get(f"/v1/responses/{first.id}").json())
        conforms("Response", http.get(f"/v1/responses/{second.id}").json())
        items = http.get(f"/v1/responses/{second.id}/input_items", params={"order": "asc"})
        conforms("ResponseItemList", items.json())
    listed = [item["type"] for item in items.json()["data"]]
    assert listed == ["message", "function_call", "function_call_output"]


def test_streamed_function_call_and_text_follow_up(capabilities_gw: Gateway, key: str) -> None:
    client = capabilities_gw.client(key)
    with client.responses.stream(
        model="fake",
        input="Weather in Paris?",
        tools=[TOOL],  # type: ignore[list-item]
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events] == CALL_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    (call,) = final.output
    assert call.type == "function_call" and final.status == "completed"
    assert final.usage and final.usage.output_tokens == 3

    with client.responses.stream(
        model="fake",
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain #stop"}],
        max_output_tokens=3,
    ) as stream:
        events = list(stream)
        follow = stream.get_final_response()
    assert [e.type for e in events] == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert follow.output_text == "tok tok tok " and follow.status == "completed"
    # stored before the stream ended: retrievable at once, as the SDK parsed it
    assert client.responses.retrieve(follow.id).output_text == follow.output_text


def test_stream_events_conform(capabilities_gw: Gateway, key: str) -> None:
    body = {"model": "fake", "input": "hi #chunks=3", "stream": True}
    with raw(capabilities_gw, key) as http:
        reply = http.post("/v1/responses", json=body)
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [
            json.loads(line.removeprefix("data: "))
            for line in reply.text.splitlines()
            if line.startswith("data: ")
        ]
        # the fake always stops at its length: the response is incomplete, not completed
        assert [e["type"] for e in events] == [*TEXT_EVENTS[:-1], "response.incomplete"]
        for event in events:
            conforms("ResponseStreamEvent", event)
        final = events[-1]["response"]
        assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 3
        assert http.get(f"/v1/responses/{final['id']}").json() == final


def test_stored_responses_are_team_scoped(capabilities_gw: Gateway, key: str, sql: Any) -> None:
    other_team = "resp-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, other_team)
    other = capabilities_gw.client(keys.create_key(sql, other_team).key)
    mine = capabilities_gw.client(key)
    made = mine.responses.create(model="fake", input="hello #chunks=2", metadata={"k": "v"})
    assert mine.responses.retrieve(made.id).metadata == {"k": "v"}
    with pytest.raises(openai.NotFoundError) as missing:
        mine.responses.retrieve("resp_doesnotexist")
    for attempt in (
        lambda: other.responses.retrieve(made.id),
        lambda: other.responses.delete(made.id),
        lambda: other.responses.input_items.list(made.id),
        lambda: other.responses.create(model="fake", input="x", previous_response_id=made.id),
    ):
        with pytest.raises(openai.NotFoundError) as foreign:
            attempt()
        # exactly like a missing one, but for the id
        assert foreign.value.body["code"] == missing.value.body["code"]  # type: ignore[index]
    assert mine.responses.retrieve(made.id).id == made.id  # untouched by the other team
    items = mine.responses.input_items.list(made.id)
    assert [i.type for i in items.data] == ["message"]
    mine.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        mine.responses.retrieve(made.id)
    unstored = mine.responses.create(model="fake", input="x #chunks=1", store=False)
    with pytest.raises(openai.NotFoundError):
        mine.responses.retrieve(unstored.id)


def test_auto_serves_responses_with_tools_only_on_a_model_with_the_flag(
    capabilities_gw: Gateway, key: str
) -> None:
    client = capabilities_gw.client(key)
    plain = client.responses.with_raw_response.create(model="auto", input="hi #chunks=1")
    assert plain.headers["x-tokenyard-model"] == "plain"  # the cheapest
    tools = client.responses.with_raw_response.create(
        model="auto",
        input="hi #chunks=1",
        tools=[TOOL],  # type: ignore[list-item]
    )
    assert tools.headers["x-tokenyard-model"] == "fake"
    assert tools.parse().output[0].type == "function_call"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": "plain", "tools": [TOOL]}, "tools"),
        (
            {
                "model": "plain",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
            },
            "text.format",
        ),
        ({"model": "fake", "reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"model": "fake", "top_logprobs": 2, "service_tier": "flex"}, "service_tier"),
        ({"model": "fake", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "fake", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ],
)
def test_what_a_model_cannot_do_is_refused_naming_the_field(
    capabilities_gw: Gateway, key: str, redis_server: Any, fields: dict, param: str
) -> None:
    with raw(capabilities_gw, key) as http:
        reply = http.post("/v1/responses", json={"input": "hi", **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["code"] == "unsupported_parameter"
    conforms("ErrorResponse", reply.json())


def test_a_refusal_reserves_nothing(
    capabilities_gw: Gateway, key: str, sql: Any, redis_server: Any
) -> None:
    name = "resp-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    client = capabilities_gw.client(keys.create_key(sql, name).key)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="plain", input="x", tools=[TOOL])  # type: ignore[list-item]
    held = reservations(redis_server.client(), name)
    assert held["leases"] == 0 and held["pages"] == 0


def test_malformed_requests_are_400s_naming_the_field(capabilities_gw: Gateway, key: str) -> None:
    with raw(capabilities_gw, key) as http:
        for body, param in (
            ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
            ({"input": 5}, "input"),
            ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
            ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
            ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
            ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ):
            reply = http.post("/v1/responses", json={"model": "fake", **body})
            assert reply.status_code == 400, (body, reply.text)
            assert reply.json()["error"]["param"] == param
        missing = http.post(
            "/v1/responses",
            json={"model": "fake", "input": "x", "previous_response_id": "resp_nope"},
        )
        assert (
            missing.status_code == 404
            and missing.json()["error"]["param"] == "previous_response_id"
        )


def test_logprobs_of_a_last_token_without_text_still_reach_a_delta() -> None:
    """The end of turn has a logprob but no text: it goes out in a delta of no text, so the
    deltas' logprobs add up to the done event's (and to the whole response's)."""
    from tokenyard.gateway.responses.events import EventWriter
    from tokenyard.gateway.responses.translate import Turn

    writer = EventWriter(Turn("resp_1", 0, {}, [], {}, {}, store=False))

    def chunk(text: str, token: str) -> dict[str, Any]:
        entry = {"token": token, "logprob": -0.5, "bytes": [], "top_logprobs": []}
        return {
            "choices": [{"index": 0, "delta": {"content": text}, "logprobs": {"content": [entry]}}]
        }

    raw = writer.chunk(chunk("Hi", "Hi")) + writer.chunk(chunk("", "<|im_end|>"))
    response, end = writer.finish()
    events = [
        json.loads(line[6:])
        for line in (raw + end).decode().splitlines()
        if line.startswith("data: ")
    ]
    deltas = [
        lp["token"]
        for e in events
        if e["type"] == "response.output_text.delta"
        for lp in e["logprobs"]
    ]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert deltas == [lp["token"] for lp in done["logprobs"]] == ["Hi", "<|im_end|>"]
    assert done["text"] == "Hi"
    assert response["output"][0]["content"][0]["logprobs"] == done["logprobs"]
