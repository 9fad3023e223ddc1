"""POST /v1/chat/completions, and the stored chat completions' routes (list, retrieve, update,
delete, messages).

A request with `store: true` is walked through the gateway like any chat request
(gateway/proxy.py); its completion, the stream's chunks put back together when streamed, is kept
for the team before the client sees the end of it, so it can be read back as soon as the client
has it. Every upstream gets the request without `store`: completions are kept here, by team, for
every kind of model, never in a provider's account that all teams share. Stored completions are
read by (team, id), so another team's id is a 404 exactly like a missing one.
"""

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream

from tokenyard.backends.sse import Splitter
from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.auth import authorization_of
from tokenyard.gateway.chats.assemble import Assembly
from tokenyard.gateway.chats.store import ChatStore, Order, Query, UnknownAfter, stored_ask
from tokenyard.gateway.paging import list_object, page
from tokenyard.gateway.proxy import Proxy
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
    async def create(
        self, request: Request, proxy: NamedDependency[Proxy], chats: NamedDependency[ChatStore]
    ) -> Response:
        body = stored_ask(await request.body())
        if body is None:
            return await proxy.handle(request, "chat")
        policy = await proxy.auth.authenticate(authorization_of(request.headers))
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        if body.get("stream") is True and (options is None or isinstance(options, dict)):
            # the stored completion has its usage even where the client did not ask for it
            walked = {**body, "stream_options": {**(options or {}), "include_usage": True}}
        else:
            walked = body
        reply = await proxy.handle(request, "chat", msgspec.json.encode(walked))
        model = reply.headers.get("x-tokenyard-model") or str(body.get("model"))
        request_id = reply.headers.get("x-request-id") or ""
        if isinstance(reply, Stream):
            headers = {k: v for k, v in reply.headers.items() if k != "content-type"}
            saved = _saving(reply, chats, policy.team, body, model, request_id, include_usage)
            return Stream(saved, media_type="text/event-stream", headers=headers)
        if reply.status_code == 200:
            completion = msgspec.json.decode(reply.content)
            await chats.save(policy.team, body, completion, model, request_id)
        return reply

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


async def _saving(
    reply: Stream,
    chats: ChatStore,
    team: str,
    body: dict[str, Any],
    model: str,
    request_id: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """The walk's events relayed as they come, their chunks folded into the completion to store;
    the usage event the gateway asked for in the client's place is not relayed. A stream that
    ends whole (`[DONE]`: the walk has settled by then) is stored before its end is sent; one
    lost mid-stream is not stored."""
    chunks = reply.iterator.__aiter__()  # type: ignore[union-attr]
    assembly, splitter = Assembly(), Splitter()
    try:
        async for data in chunks:
            out = []
            for block in splitter.feed(data):
                payload = block[5:].strip() if block.startswith(b"data:") else b""
                if payload == b"[DONE]":
                    completion = assembly.completion()
                    await chats.save(team, body, completion, model, request_id)
                elif payload and _folded(assembly, payload) == "usage" and not include_usage:
                    continue
                out.append(block)
            if out:
                yield b"".join(block + b"\n\n" for block in out)
    finally:
        await chunks.aclose()  # the walk's stream settles when closed


def _folded(assembly: Assembly, payload: bytes) -> str:
    """Fold one event's chunk into `assembly`: "usage" for the usage event (no choices), "chunk"
    for any other chunk, "other" for an error or anything that is not a chunk."""
    try:
        chunk = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return "other"
    if not isinstance(chunk, dict) or "error" in chunk:
        return "other"
    assembly.add(chunk)
    return "usage" if not chunk.get("choices") and chunk.get("usage") is not None else "chunk"
