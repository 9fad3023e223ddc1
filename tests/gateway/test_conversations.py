"""OpenAI's Conversations API with the official SDK, over the fake upstream: a conversation's
items are the context of each response made with it, and each response adds its input and output
to them (whole and streamed); items added, listed, read and deleted; team-scoped; every object
validated against OpenAI's OpenAPI document."""

from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Gateway, upstream_stats
from tests.openai_spec import problems


def conforms(name: str, instance: Any) -> None:
    found = problems(name, instance)
    assert not found, f"{name}: {found[:5]}"


def sent_texts(upstream: str) -> list[tuple[str, str]]:
    """What the model last read: (role, text) of each message."""
    messages = upstream_stats(upstream)["last_body"]["messages"]
    return [(m["role"], m["content"]) for m in messages]


def test_responses_read_and_grow_their_conversation(
    capabilities_gw: Gateway, team: Any, upstream: str
) -> None:
    key = team()[1]
    client = capabilities_gw.client(key)
    raw = httpx.Client(
        base_url=capabilities_gw.url + "/v1", headers={"authorization": f"Bearer {key}"}
    )
    conv = client.conversations.create(
        metadata={"topic": "rivers"},
        items=[{"type": "message", "role": "user", "content": "Hi #chunks=2"}],
    )
    conforms("ConversationResource", raw.get(f"/conversations/{conv.id}").json())
    first = client.responses.create(model="fake", conversation=conv.id, input="Name one #chunks=3")
    assert first.conversation is not None and first.conversation.id == conv.id
    assert sent_texts(upstream) == [("user", "Hi #chunks=2"), ("user", "Name one #chunks=3")]
    items = raw.get(f"/conversations/{conv.id}/items", params={"order": "asc"}).json()
    conforms("ConversationItemList", items)
    assert [(i["type"], i.get("role")) for i in items["data"]] == [
        ("message", "user"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert items["data"][2]["id"] == first.output[0].id
    with client.responses.stream(
        model="fake", conversation={"id": conv.id}, input="Another #chunks=2 #stop"
    ) as stream:
        done = stream.get_final_response()
    assert sent_texts(upstream)[2] == ("assistant", first.output_text)
    latest = client.conversations.items.list(conv.id)  # newest first, OpenAI's default
    assert [i.id for i in latest.data][:2] == [done.output[0].id, latest.data[1].id]
    assert len(latest.data) == 5
    # counting a request's tokens reads the conversation too (the fake counts words)
    counted = client.responses.input_tokens.count(model="fake", conversation=conv.id, input="x")
    said = "Hi #chunks=2 Name one #chunks=3 Another #chunks=2 #stop x"
    assert counted.input_tokens == len(said.split()) + 3 + 2  # and the two answers


def test_items_added_read_and_deleted(capabilities_gw: Gateway, team: Any, upstream: str) -> None:
    client = capabilities_gw.client(team()[1])
    conv = client.conversations.create()
    assert conv.metadata == {} and client.conversations.items.list(conv.id).data == []
    added = client.conversations.items.create(
        conv.id,
        items=[
            {"type": "message", "role": "system", "content": "Answer in French."},
            {"type": "message", "role": "user", "content": "Bonjour #chunks=1"},
        ],
    )
    assert [i.type for i in added.data] == ["message", "message"]
    system_id = added.data[0].id
    assert client.conversations.items.retrieve(system_id, conversation_id=conv.id).id == system_id
    kept = client.conversations.items.delete(system_id, conversation_id=conv.id)
    assert kept.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(system_id, conversation_id=conv.id)
    client.responses.create(model="fake", conversation=conv.id, input="Encore #chunks=1")
    assert sent_texts(upstream) == [("user", "Bonjour #chunks=1"), ("user", "Encore #chunks=1")]
    changed = client.conversations.update(conv.id, metadata={"lang": "fr"})
    assert client.conversations.retrieve(conv.id).metadata == changed.metadata == {"lang": "fr"}
    gone = client.conversations.delete(conv.id)
    assert gone.deleted and gone.id == conv.id
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)


def test_conversations_are_the_teams_own_and_refusals(capabilities_gw: Gateway, team: Any) -> None:
    mine = capabilities_gw.client(team()[1])
    other = capabilities_gw.client(team()[1])
    conv = mine.conversations.create(items=[{"type": "message", "role": "user", "content": "x"}])
    item = mine.conversations.items.list(conv.id).data[0].id
    for attempt in (
        lambda: other.conversations.retrieve(conv.id),
        lambda: other.conversations.update(conv.id, metadata={"k": "v"}),
        lambda: other.conversations.delete(conv.id),
        lambda: other.conversations.items.list(conv.id),
        lambda: other.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "user", "content": "y"}]
        ),
        lambda: other.conversations.items.retrieve(item, conversation_id=conv.id),
        lambda: other.responses.create(model="fake", conversation=conv.id, input="y"),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert len(mine.conversations.items.list(conv.id).data) == 1  # untouched
    first = mine.responses.create(model="fake", input="hi #chunks=1")
    with pytest.raises(openai.BadRequestError) as both:
        mine.responses.create(
            model="fake", conversation=conv.id, previous_response_id=first.id, input="y"
        )
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    too_many = [{"type": "message", "role": "user", "content": str(i)} for i in range(21)]
    with pytest.raises(openai.BadRequestError):
        mine.conversations.create(items=too_many)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as bad_role:
        mine.conversations.items.create(
            conv.id, items=[{"type": "message", "role": "robot", "content": "y"}]
        )  # type: ignore[list-item]
    assert bad_role.value.body["param"].startswith("items[0]")  # type: ignore[index]
