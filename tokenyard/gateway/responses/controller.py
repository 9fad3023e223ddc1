"""POST /v1/responses, its input-token count, and the stored responses' routes (retrieve, delete,
input_items).

A response is made by translating the request onto chat completions and walking it through the
gateway like any chat request (keys, quotas, `auto`, fallbacks, billing: gateway/proxy.py), then
translating the reply, or the stream's chunks, back. Stored responses are read by (team, id), so
another team's id is a 404 exactly like a missing one.
"""

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream

from tokenyard.backends import sse
from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.paging import page
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.request_ids import request_id
from tokenyard.gateway.responses.conversation_store import ConversationStore, missing_conversation
from tokenyard.gateway.responses.events import ENDINGS, EventWriter, sse_event
from tokenyard.gateway.responses.store import ResponseStore, Stored
from tokenyard.gateway.responses.translate import (
    PARAMS,
    CreateResponse,
    Turn,
    adopt,
    begin,
    conversation_of,
    from_chat,
)
from tokenyard.gateway.token_counts import count_tokens
from tokenyard.gateway.validation import decode_json
from tokenyard.tenancy.policy import TeamPolicy

log = logging.getLogger("tokenyard.responses")


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


async def _stored(
    store: ResponseStore, team: str, response_id: str, param: str = "response_id"
) -> Stored:
    found = await store.get(team, response_id)
    if found is None:
        raise GatewayError(
            404, f"no response with id {response_id!r}", code="not_found", param=param
        )
    return found


def _request(raw: Any) -> CreateResponse:
    if not isinstance(raw, dict):
        raise GatewayError(400, "request body must be a JSON object")
    try:
        return msgspec.convert(raw, CreateResponse)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.rpartition("at `$.")[2].rstrip("`") if "at `$." in text else None
        raise GatewayError(400, text, param=param) from None


async def _turn(
    store: ResponseStore, conversations: ConversationStore, team: str, raw: Any
) -> Turn:
    """The request's turn, after the stored one it follows (previous_response_id), or after the
    items of its conversation."""
    req = _request(raw)
    conversation = conversation_of(req)
    earlier: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = await _stored(store, team, req.previous_response_id, "previous_response_id")
        earlier = previous.context + previous.response["output"]
    elif conversation is not None:
        found = await conversations.items(team, conversation)
        if found is None:
            raise missing_conversation(conversation, "conversation")
        earlier = found
    return begin(req, raw, earlier, conversation)


async def _keep(
    turn: Turn,
    response: dict[str, Any],
    store: ResponseStore,
    conversations: ConversationStore,
    team: str,
) -> None:
    """A finished response: stored (`store`), and its input and output added to its
    conversation."""
    if turn.store:
        await store.save(team, response, turn.context)
    if turn.conversation is not None:
        added = turn.fresh + list(response.get("output") or ())
        await conversations.add(team, turn.conversation, added)


class ResponsesController(Controller):
    path = "/v1/responses"

    @post("", status_code=200, operation_class=json_body(CreateResponse))
    async def create(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        responses: NamedDependency[ResponseStore],
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
    ) -> Response:
        team = caller.team
        turn = await _turn(responses, conversations, team, decode_json(await request.body()))
        try:
            chat = msgspec.json.encode(turn.chat)
            reply = await proxy.handle(request, "chat", chat, responses=turn.native)
        except GatewayError as exc:  # name the field as the client sent it
            exc.param = PARAMS.get(exc.param or "", exc.param)
            raise
        turn.model = reply.headers.get("x-tokenyard-model") or turn.model
        served = proxy.router.catalog.get(turn.model)
        native = served is not None and served.provider == "openai"  # answered in kind
        headers = dict(reply.headers)
        if isinstance(reply, Stream):
            headers.pop("content-type", None)
            relay = _native_events if native else _events
            events = relay(turn, reply, responses, conversations, team)
            return Stream(events, media_type="text/event-stream", headers=headers)
        if reply.status_code != 200:  # the upstream's refusal, already OpenAI's error shape
            return reply
        data = msgspec.json.decode(reply.content)
        response = adopt(turn, data) if native else from_chat(turn, data)
        await _keep(turn, response, responses, conversations, team)
        headers.pop("content-length", None)
        return Response(
            msgspec.json.encode(response), media_type="application/json", headers=headers
        )

    @post("/input_tokens", status_code=200, operation_class=json_body(CreateResponse))
    async def input_tokens(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        responses: NamedDependency[ResponseStore],
        conversations: NamedDependency[ConversationStore],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """OpenAI's input-token count of a Responses request, earlier turns by
        previous_response_id or its conversation included (gateway/token_counts.py)."""
        raw = decode_json(await request.body())
        turn = await _turn(responses, conversations, caller.team, raw)
        try:
            counted = await count_tokens(
                proxy, caller, request_id(request.scope), turn.chat, turn.native
            )
        except GatewayError as exc:
            exc.param = PARAMS.get(exc.param or "", exc.param)
            raise
        body = {"object": "response.input_tokens", "input_tokens": counted.tokens}
        return Response(msgspec.json.encode(body), headers=counted.headers)

    @get("/{response_id:str}")
    async def retrieve(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        return _json((await _stored(responses, caller.team, response_id)).response)

    @delete("/{response_id:str}", status_code=200)
    async def remove(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
    ) -> Response[bytes]:
        if not await responses.delete(caller.team, response_id):
            await _stored(responses, caller.team, response_id)  # the same 404 as a retrieve
        return _json({"id": response_id, "object": "response", "deleted": True})

    @get("/{response_id:str}/input_items")
    async def input_items(
        self,
        responses: NamedDependency[ResponseStore],
        caller: NamedDependency[TeamPolicy],
        response_id: FromPath[str],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        items = (await _stored(responses, caller.team, response_id)).context
        missing = f"no input item {after!r} in this response"
        return _json(page(items, limit, order, after, missing))


async def _payloads(reply: Stream) -> AsyncIterator[Any]:
    """The walk's event stream as decoded `data:` payloads, `[DONE]` as None."""
    chunks = reply.iterator.__aiter__()  # type: ignore[union-attr]
    try:
        async for event in sse.events(chunks):
            yield None if event.data == b"[DONE]" else msgspec.json.decode(event.data)
    finally:
        await chunks.aclose()  # the walk's stream settles when closed


def _lost(data: Any) -> dict[str, Any] | None:
    """The walk's own event for an upstream lost mid-stream (an OpenAI error body)."""
    if isinstance(data, dict) and "type" not in data and isinstance(data.get("error"), dict):
        return data["error"]
    return None


async def _events(
    turn: Turn, reply: Stream, store: ResponseStore, conversations: ConversationStore, team: str
) -> AsyncIterator[bytes]:
    """A chat stream as Responses events. The walk's stream settles before it sends its closing
    `[DONE]`, and the response is stored before `response.completed`: a follow-up by
    previous_response_id can be sent as soon as the client sees the end."""
    writer = EventWriter(turn)
    yield writer.start()
    async for data in _payloads(reply):
        if data is None:
            response, tail = writer.finish()
            await _keep(turn, response, store, conversations, team)
            yield tail
            return
        if (error := _lost(data)) is not None:
            yield writer.failed(error.get("message", ""), error.get("code") or "")
            return
        if out := writer.chunk(data):
            yield out
    yield writer.failed("the model's stream ended early", "upstream_error")


async def _native_events(
    turn: Turn, reply: Stream, store: ResponseStore, conversations: ConversationStore, team: str
) -> AsyncIterator[bytes]:
    """OpenAI's own Responses events, under the gateway's response id; stored, as above, before
    the final event goes out."""
    writer = EventWriter(turn)
    async for data in _payloads(reply):
        if data is None:
            continue
        if (error := _lost(data)) is not None:
            yield writer.failed(error.get("message", ""), error.get("code") or "")
            return
        if isinstance(data.get("response"), dict):
            adopt(turn, data["response"])
            if data.get("type") in ENDINGS:
                await _keep(turn, data["response"], store, conversations, team)
        writer.sequence = data.get("sequence_number", writer.sequence) + 1
        yield sse_event(data)
