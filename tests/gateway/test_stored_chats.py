"""Stored chat completions (`store: true`) with the official SDK, over the fake upstream: read back
whole and streamed (tool calls included), listed with filters and pages, relabelled, deleted,
their messages listed; team-scoped; never sent upstream; every object validated against OpenAI's
OpenAPI document."""

from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Gateway, upstream_stats
from tests.openai_spec import problems
from tokenyard.gateway.chats.assemble import Assembly

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def conforms(name: str, instance: Any) -> None:
    found = problems(name, instance)
    assert not found, f"{name}: {found[:5]}"


def api(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url + "/v1", headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def test_a_stored_completion_reads_back_as_it_was_returned(
    gateway: Gateway, team: Any, upstream: str
) -> None:
    client = gateway.client(team()[1])
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hello #chunks=3 #stop"}]},
    ]
    made = client.chat.completions.create(
        model="fake", messages=messages, store=True, metadata={"project": "atlas"}, seed=7
    )
    assert "store" not in upstream_stats(upstream)["last_body"]  # kept here, not upstream
    got = client.chat.completions.retrieve(made.id)
    assert got.choices[0].message.content == made.choices[0].message.content == "tok tok tok "
    assert got.usage == made.usage and got.model == made.model
    assert got.metadata == {"project": "atlas"}  # type: ignore[attr-defined]
    raw = api(gateway, team()[1])  # a team of its own: the same id is missing there
    assert raw.get(f"/chat/completions/{made.id}").status_code == 404
    stored = api(gateway, client.api_key).get(f"/chat/completions/{made.id}").json()
    conforms("CreateChatCompletionResponse", stored)
    assert stored["seed"] == 7 and stored["request_id"]
    listed = client.chat.completions.messages.list(made.id)
    assert [(m.id, m.role, m.content) for m in listed.data] == [
        (f"{made.id}-0", "system", "Be brief."),
        (f"{made.id}-1", "user", "hello #chunks=3 #stop"),
    ]
    assert listed.data[1].content_parts[0].text == "hello #chunks=3 #stop"  # type: ignore[index]
    page = api(gateway, client.api_key).get(f"/chat/completions/{made.id}/messages").json()
    # the document types each message as the assistant's, though its own example lists the
    # user's message: every other property must conform
    found = problems("ChatCompletionMessageList", page)
    assert [p for p in found if "is not one of ['assistant']" not in p] == []
    assert len(found) == 2  # the two roles, and nothing else
    later = client.chat.completions.messages.list(made.id, after=f"{made.id}-0", limit=1)
    assert [m.role for m in later.data] == ["user"] and not later.has_more


def test_only_requests_that_ask_are_stored(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    for store in (None, False):
        extra = {} if store is None else {"store": store}
        client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi #chunks=1"}], **extra
        )
    assert client.chat.completions.list().data == []


def test_lists_page_in_order_and_filter_by_metadata_and_model(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    ids = []
    for i in range(5):
        made = client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": f"question {i} #chunks=1"}],
            store=True,
            metadata={"run": "even" if i % 2 == 0 else "odd", "n": str(i)},
        )
        ids.append(made.id)
    raw = api(gateway, client.api_key)
    first = raw.get("/chat/completions", params={"limit": 2}).json()
    conforms("ChatCompletionList", first)
    assert [c["id"] for c in first["data"]] == ids[:2] and first["has_more"]
    assert [c.id for c in client.chat.completions.list(limit=2)] == ids  # the SDK pages on
    rest = client.chat.completions.list(after=ids[1], limit=10)
    assert [c.id for c in rest.data] == ids[2:] and not rest.has_more
    newest = client.chat.completions.list(order="desc", limit=2)
    assert [c.id for c in newest.data] == ids[:2:-1][:2]
    even = raw.get("/chat/completions", params={"metadata[run]": "even"}).json()
    assert [c["id"] for c in even["data"]] == ids[0::2]
    both = raw.get("/chat/completions", params={"metadata[run]": "odd", "metadata[n]": "3"})
    assert [c["id"] for c in both.json()["data"]] == [ids[3]]
    assert client.chat.completions.list(model="fake").data[0].id == ids[0]
    assert client.chat.completions.list(model="other").data == []
    unknown = raw.get("/chat/completions", params={"after": "chatcmpl-nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "after"
    assert raw.get("/chat/completions", params={"limit": 101}).status_code == 400


def test_metadata_changes_and_deletes_are_the_teams_own(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    other = gateway.client(team()[1])
    made = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi #chunks=1"}],
        store=True,
        metadata={"stage": "draft"},
    )
    for attempt in (
        lambda: other.chat.completions.retrieve(made.id),
        lambda: other.chat.completions.update(made.id, metadata={"stage": "theirs"}),
        lambda: other.chat.completions.delete(made.id),
        lambda: other.chat.completions.messages.list(made.id),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert other.chat.completions.list().data == []
    changed = client.chat.completions.update(made.id, metadata={"stage": "final"})
    assert changed.metadata == {"stage": "final"}  # type: ignore[attr-defined]
    assert client.chat.completions.list(metadata={"stage": "final"}).data[0].id == made.id
    assert client.chat.completions.list(metadata={"stage": "draft"}).data == []
    raw = api(gateway, client.api_key)
    for bad in ({"metadata": {"k": 1}}, {"metadata": {f"k{i}": "v" for i in range(17)}}, {}):
        refused = raw.post(f"/chat/completions/{made.id}", json=bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["type"] == "invalid_request_error"
    gone = raw.delete(f"/chat/completions/{made.id}").json()
    conforms("ChatCompletionDeleted", gone)
    assert gone == {"object": "chat.completion.deleted", "id": made.id, "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.delete(made.id)


def test_a_stored_stream_is_the_completion_its_chunks_make(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    chunks = list(
        client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "stream it #chunks=4 #stop"}],
            stream=True,
            store=True,
        )
    )
    # the usage chunk was asked for the store, not by the client: the client does not get it
    assert all(c.choices and c.usage is None for c in chunks)
    got = client.chat.completions.retrieve(chunks[0].id)
    assert got.choices[0].message.content == "".join(c.choices[0].delta.content for c in chunks)
    assert got.choices[0].finish_reason == "stop"
    assert got.usage is not None and got.usage.completion_tokens == 4
    with_usage = list(
        client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "again #chunks=2"}],
            stream=True,
            stream_options={"include_usage": True},
            store=True,
        )
    )
    assert with_usage[-1].usage is not None and not with_usage[-1].choices
    assert client.chat.completions.retrieve(with_usage[0].id).usage == with_usage[-1].usage


def test_a_streamed_tool_call_is_stored_whole(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    chunks = list(
        client.chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[TOOL],  # type: ignore[list-item]
            stream=True,
            store=True,
        )
    )
    got = client.chat.completions.retrieve(chunks[0].id)
    call = got.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    assert got.choices[0].finish_reason == "tool_calls"
    assert got.tools[0]["function"]["name"] == "get_weather"  # type: ignore[attr-defined]


def test_a_stream_lost_midway_is_not_stored(gateway: Gateway, team: Any) -> None:
    client = gateway.client(team()[1])
    stream = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "break #chunks=5 #fail=2"}],
        stream=True,
        store=True,
    )
    with pytest.raises(openai.APIError):
        list(stream)
    assert client.chat.completions.list().data == []


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_chunks_fold_like_openais_whole_reply() -> None:
    assembly = Assembly()
    head = {"id": "chatcmpl-1", "created": 5, "model": "m", "object": "chat.completion.chunk"}
    top = {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}
    for delta, finish, logprobs in (
        ({"role": "assistant", "content": ""}, None, None),
        ({"content": "Hi"}, None, {"content": [top]}),
        (
            {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]},
            None,
            None,
        ),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}, None, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "tool_calls", None),
    ):
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        assembly.add({**head, "choices": [choice]})
    assembly.add(
        {**head, "choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": "length"}]}
    )
    assembly.add({**head, "choices": [], "usage": USAGE})
    done = assembly.completion()
    conforms("CreateChatCompletionResponse", done)
    first, second = done["choices"]
    assert first["message"]["content"] == "Hi" and first["finish_reason"] == "tool_calls"
    assert first["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    assert first["logprobs"]["content"] == [top]
    assert second["message"]["content"] == "x" and second["finish_reason"] == "length"
    assert done["usage"] == USAGE
    assert (done["id"], done["created"], done["model"]) == ("chatcmpl-1", 5, "m")
