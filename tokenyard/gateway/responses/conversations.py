"""OpenAI's Conversations API: `/v1/conversations` (create, retrieve, update, delete) and their
items (add, list, retrieve, delete). A response made with `conversation` reads its items as the
context and adds its own input and output to them (gateway/responses/controller.py). Read by
(team, id), so another team's conversation is a 404 exactly like a missing one."""

from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.paging import list_object, page
from tokenyard.gateway.responses.conversation_store import ConversationStore, missing_conversation
from tokenyard.gateway.responses.translate import normalized
from tokenyard.gateway.validation import Metadata, convert, decode_json
from tokenyard.tenancy.policy import TeamPolicy

MAX_ITEMS = 20  # items one call may add, as at OpenAI
Items = Annotated[list[dict[str, Any]], msgspec.Meta(max_length=MAX_ITEMS)]


class CreateConversation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    metadata: Metadata | None = None
    items: Items | None = None


class UpdateConversation(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    metadata: Metadata


class AddItems(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: Items


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


async def _body(request: Request, struct: type[Any]) -> Any:
    return convert(decode_json(await request.body()), struct)


def _items(given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as a conversation keeps them (ids set), refusals naming `items`."""
    try:
        return normalized(given)
    except GatewayError as exc:
        exc.param = (exc.param or "").replace("input", "items", 1) or "items"
        raise


class ConversationsController(Controller):
    path = "/v1/conversations"

    @post("", status_code=200, operation_class=json_body(CreateConversation))
    async def create(
        self,
        request: Request,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        asked = await _body(request, CreateConversation)
        items = _items(asked.items or [])
        return _json(await conversations.create(caller.team, asked.metadata, items))

    @get("/{conversation_id:str}")
    async def retrieve(
        self,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
    ) -> Response[bytes]:
        found = await conversations.get(caller.team, conversation_id)
        if found is None:
            raise missing_conversation(conversation_id)
        return _json(found)

    @post("/{conversation_id:str}", status_code=200, operation_class=json_body(UpdateConversation))
    async def update(
        self,
        request: Request,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
    ) -> Response[bytes]:
        asked = await _body(request, UpdateConversation)
        found = await conversations.relabel(caller.team, conversation_id, asked.metadata)
        if found is None:
            raise missing_conversation(conversation_id)
        return _json(found)

    @delete("/{conversation_id:str}", status_code=200)
    async def remove(
        self,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
    ) -> Response[bytes]:
        if not await conversations.delete(caller.team, conversation_id):
            raise missing_conversation(conversation_id)
        return _json({"id": conversation_id, "object": "conversation.deleted", "deleted": True})

    @post("/{conversation_id:str}/items", status_code=200, operation_class=json_body(AddItems))
    async def add_items(
        self,
        request: Request,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
    ) -> Response[bytes]:
        items = _items((await _body(request, AddItems)).items)
        if not await conversations.add(caller.team, conversation_id, items):
            raise missing_conversation(conversation_id)
        return _json(list_object(items, False))

    @get("/{conversation_id:str}/items")
    async def list_items(
        self,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        items = await conversations.items(caller.team, conversation_id)
        if items is None:
            raise missing_conversation(conversation_id)
        return _json(page(items, limit, order, after, f"no item {after!r} in this conversation"))

    @get("/{conversation_id:str}/items/{item_id:str}")
    async def retrieve_item(
        self,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
        item_id: FromPath[str],
    ) -> Response[bytes]:
        known, item = await conversations.item(caller.team, conversation_id, item_id)
        if not known:
            raise missing_conversation(conversation_id)
        if item is None:
            raise GatewayError(404, f"no item {item_id!r} in this conversation", param="item_id")
        return _json(item)

    @delete("/{conversation_id:str}/items/{item_id:str}", status_code=200)
    async def remove_item(
        self,
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
        conversation_id: FromPath[str],
        item_id: FromPath[str],
    ) -> Response[bytes]:
        """Answers the conversation, as OpenAI does."""
        found, gone = await conversations.delete_item(caller.team, conversation_id, item_id)
        if found is None:
            raise missing_conversation(conversation_id)
        if not gone:
            raise GatewayError(404, f"no item {item_id!r} in this conversation", param="item_id")
        return _json(found)
