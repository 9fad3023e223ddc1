"""Truncation "auto": a conversation longer than the model's context loses its oldest turns
instead of being refused. The rule on its own (which turns go, which stay), then through the
gateway with the official SDK, on chat completions and on the Responses API, against a team whose
context cap the conversation overflows."""

import uuid
from typing import Any

import msgspec
import openai
import pytest

from tests.gateway.conftest import MODEL, Gateway, upstream_stats
from tests.openai_spec import problems
from tokenyard.gateway import truncation
from tokenyard.gateway.validation import Parsed, parse
from tokenyard.tenancy import keys, teams

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do " * 10  # ~160 tokens


def _parsed(messages: list[dict[str, Any]]) -> Parsed:
    body = {"model": "m", "messages": messages, "truncation": "auto"}
    return parse(msgspec.json.encode(body), "chat")


def _turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"u{i} " + WORDS},
        {"role": "assistant", "content": f"a{i} " + WORDS},
    ]


def test_the_oldest_turns_go_first_and_the_instructions_and_last_turn_stay() -> None:
    messages = [{"role": "system", "content": "be brief"}, *_turn(1), *_turn(2), *_turn(3)]
    messages += [{"role": "developer", "content": "dev note"}, {"role": "user", "content": "now?"}]
    parsed = _parsed(messages)
    assert parsed.truncate and "truncation" not in parsed.body  # a gateway field, not forwarded
    whole = parsed.prompt_tokens
    truncation.fit(parsed, whole)  # fits already: untouched
    assert parsed.dropped == 0 and len(parsed.body["messages"]) == len(messages)
    truncation.fit(parsed, whole - 1)  # one turn too many: the oldest goes, whole
    assert parsed.dropped == 2 and parsed.prompt_tokens < whole
    assert [m["content"][:2] for m in parsed.body["messages"]][:3] == ["be", "u2", "a2"]
    truncation.fit(parsed, 0)  # nothing fits: all but the instructions and the last turn go
    assert [m["content"] for m in parsed.body["messages"]] == ["be brief", "dev note", "now?"]
    # the size is the kept messages' own estimate
    assert (
        parsed.dropped == 6
        and parsed.prompt_tokens == _parsed(parsed.body["messages"]).prompt_tokens
    )


def test_tool_results_go_with_their_call_and_the_last_turns_calls_stay() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "u1 " + WORDS},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1 " + WORDS},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2 look it up"},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2 " + WORDS},
    ]
    parsed = _parsed(messages)
    truncation.fit(parsed, 0)
    kept = parsed.body["messages"]
    assert [m["role"] for m in kept] == ["user", "assistant", "tool"]  # opens with the user
    assert kept[0]["content"] == "u2 look it up" and kept[2]["tool_call_id"] == "c2"
    # a conversation with no user message at all has nothing it could drop safely
    lone = _parsed([{"role": "system", "content": WORDS}, {"role": "assistant", "content": WORDS}])
    truncation.fit(lone, 0)
    assert lone.dropped == 0


@pytest.fixture
def short_context(sql: Any) -> str:
    """A key of a team whose prompt + output may be at most 400 tokens."""
    name = "trunc-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name, max_context=400)
    return keys.create_key(sql, name).key


def _conversation(turns: int) -> list[dict[str, Any]]:
    history = [m for i in range(turns) for m in _turn(i)]
    return [{"role": "system", "content": "sys"}, *history, {"role": "user", "content": "q #stop"}]


def test_chat_completions_drop_what_the_context_cannot_hold(
    gateway: Gateway, upstream: str, short_context: str
) -> None:
    client = gateway.client(short_context)
    conversation = _conversation(4)  # ~1,300 tokens against 400
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=conversation, max_tokens=50)
    assert refused.value.code == "context_length_exceeded"
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation, max_tokens=50, extra_body={"truncation": "auto"}
    )
    assert reply.http_response.status_code == 200
    sent = upstream_stats(upstream)["last_body"]
    assert "truncation" not in sent
    # each turn is ~170 tokens: the system message, one turn and the question fit under 350
    assert [m["content"][:2] for m in sent["messages"]] == ["sy", "u3", "a3", "q "]
    assert reply.http_response.headers["x-tokenyard-truncated"] == "6"
    assert reply.parse().usage.prompt_tokens > 0


def test_responses_truncate_a_long_conversation_when_asked(
    capabilities_gw: Gateway, upstream: str, sql: Any
) -> None:
    name = "trunc-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name, max_context=400)
    client = capabilities_gw.client(keys.create_key(sql, name).key)
    items = _conversation(4)[1:]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="fake", input=items, max_output_tokens=50)
    assert refused.value.code == "context_length_exceeded"
    response = client.responses.create(
        model="fake", input=items, max_output_tokens=50, truncation="auto", instructions="sys"
    )
    assert response.status == "completed" and response.truncation == "auto"
    stored = client.responses.with_raw_response.retrieve(response.id).http_response.json()
    assert stored["truncation"] == "auto" and not problems("Response", stored)
    sent = upstream_stats(upstream)["last_body"]["messages"]
    assert sent[0] == {"role": "system", "content": "sys"} and len(sent) == 4
    # the stored response keeps the whole conversation: a follow-up truncates it again
    follow = client.responses.create(
        model="fake",
        previous_response_id=response.id,
        input="and then? #stop",
        max_output_tokens=50,
        truncation="auto",
    )
    assert follow.status == "completed"
    assert len(client.responses.input_items.list(follow.id).data) == len(items) + 2
