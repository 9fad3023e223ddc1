"""POST /v1/chat/completions (gateway/chats/service.py), and the stored chat completions' routes
(list, retrieve, update, delete, messages).

A request with `store: true` is walked through the gateway like any chat request; its completion
is kept for the team before the client sees the end of it, so it can be read back as soon as the
client has it. Every upstream gets the request without `store`: completions are kept here, by
team, for every kind of model, never in a provider's account that all teams share. Stored
completions are read by (team, id), so another team's id is a 404 exactly like a missing one.
"""

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter

from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.chats.service import ChatService
from tokenyard.gateway.chats.store import ChatStore, Order, Query, UnknownAfter
from tokenyard.gateway.paging import list_object, page
from tokenyard.gateway.validation import ChatRequest, Metadata, convert, decode_json
from tokenyard.tenancy.policy import TeamPolicy

MAX_PAGE = 100


class Relabel(msgspec.Struct, forbid_unknown_fields=True):
    """POST /v1/chat/completions/{id}: the completion's new metadata (null clears it)."""

    metadata: Metadata | None


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


def _missing(completion_id: str) -> GatewayError:
    return GatewayError(
        404,
        f"no stored chat completion with id {completion_id!r}",
        code="not_found",
        param="completion_id",
    )


class ChatCompletionsController(Controller):
    path = "/v1/chat/completions"

    @post("", status_code=200, operation_class=json_body(ChatRequest))
    async def create(self, request: Request, chat: NamedDependency[ChatService]) -> Response:
        return await chat.create(request)

    @get("")
    async def list_completions(
        self,
        request: Request,
        chats: NamedDependency[ChatStore],
        caller: NamedDependency[TeamPolicy],
        model: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 20,
        order: FromQuery[Order] = "asc",
    ) -> Response[bytes]:
        """The team's stored completions, oldest first unless `order=desc`; `metadata[k]=v`
        pairs must all match."""
        labels = {
            name[len("metadata[") : -1]: value
            for name, value in request.query_params.items()
            if name.startswith("metadata[") and name.endswith("]")
        }
        query = Query(model, labels, after, limit, order)
        try:
            items, more = await chats.page(caller.team, query)
        except UnknownAfter:
            raise GatewayError(
                400, f"no stored chat completion with id {after!r}", param="after"
            ) from None
        return _json(list_object(items, more))

    @get("/{completion_id:str}")
    async def retrieve(
        self,
        chats: NamedDependency[ChatStore],
        caller: NamedDependency[TeamPolicy],
        completion_id: FromPath[str],
    ) -> Response[bytes]:
        found = await chats.get(caller.team, completion_id)
        if found is None:
            raise _missing(completion_id)
        return _json(found)

    @post("/{completion_id:str}", status_code=200, operation_class=json_body(Relabel))
    async def update(
        self,
        request: Request,
        chats: NamedDependency[ChatStore],
        caller: NamedDependency[TeamPolicy],
        completion_id: FromPath[str],
    ) -> Response[bytes]:
        """Only the metadata of a stored completion can change, as at OpenAI."""
        change = convert(decode_json(await request.body()), Relabel)
        found = await chats.relabel(caller.team, completion_id, change.metadata)
        if found is None:
            raise _missing(completion_id)
        return _json(found)

    @delete("/{completion_id:str}", status_code=200)
    async def remove(
        self,
        chats: NamedDependency[ChatStore],
        caller: NamedDependency[TeamPolicy],
        completion_id: FromPath[str],
    ) -> Response[bytes]:
        if not await chats.delete(caller.team, completion_id):
            raise _missing(completion_id)
        return _json({"object": "chat.completion.deleted", "id": completion_id, "deleted": True})

    @get("/{completion_id:str}/messages")
    async def messages(
        self,
        chats: NamedDependency[ChatStore],
        caller: NamedDependency[TeamPolicy],
        completion_id: FromPath[str],
        after: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 20,
        order: FromQuery[Order] = "asc",
    ) -> Response[bytes]:
        items = await chats.messages(caller.team, completion_id)
        if items is None:
            raise _missing(completion_id)
        missing = f"no message {after!r} in this chat completion"
        return _json(page(items, limit, order, after, missing))
