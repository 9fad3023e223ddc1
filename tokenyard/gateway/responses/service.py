"""POST /v1/responses and its input-token count: a request's turn (after the stored response it
follows, or its conversation's items), walked through the gateway like any chat request (keys,
quotas, `auto`, fallbacks, billing: gateway/proxy.py), its reply or stream translated back, and
the finished response stored and added to its conversation; or, in background mode, queued and
walked by a task (gateway/responses/background.py). Stored responses are read, cancelled and
deleted here too.

One object holds the walk and both stores, so each route resolves a single dependency: Litestar
resolves two or more in an anyio task group, 75 µs a request measured (gateway/chats/service.py).
"""

from functools import partial
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from tokenyard.core.errors import GatewayError
from tokenyard.gateway.proxy import Proxy, tier_of
from tokenyard.gateway.request_ids import request_id
from tokenyard.gateway.responses.background import UNFINISHED, Background
from tokenyard.gateway.responses.conversation_store import ConversationStore, missing_conversation
from tokenyard.gateway.responses.events import EventWriter, chat_events, native_events
from tokenyard.gateway.responses.prompts import PromptStore, missing_prompt, rendered
from tokenyard.gateway.responses.store import ResponseStore, Stored
from tokenyard.gateway.responses.translate import (
    PARAMS,
    CreateResponse,
    Prompt,
    PromptRef,
    Turn,
    adopt,
    begin,
    conversation_of,
    from_chat,
)
from tokenyard.gateway.streaming import SSE_HEADERS
from tokenyard.gateway.token_counts import count_tokens
from tokenyard.gateway.validation import decode_json


async def stored(
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


class ResponsesService:
    def __init__(
        self,
        proxy: Proxy,
        store: ResponseStore,
        conversations: ConversationStore,
        prompts: PromptStore,
    ) -> None:
        self.proxy = proxy
        self.store = store
        self.conversations = conversations
        self.prompts = prompts
        self.background = Background(proxy, store, proxy.quotas.redis)

    async def _turn(self, team: str, raw: Any) -> Turn:
        """The request's turn, after the stored one it follows (previous_response_id), or after
        the items of its conversation."""
        req = _request(raw)
        conversation = conversation_of(req)
        earlier: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            previous = await stored(
                self.store, team, req.previous_response_id, "previous_response_id"
            )
            if previous.response.get("status") in UNFINISHED:
                raise GatewayError(
                    400,
                    f"response {req.previous_response_id!r} is still {previous.response['status']}",
                    param="previous_response_id",
                )
            earlier = previous.context + previous.response["output"]
        elif conversation is not None:
            found = await self.conversations.items(team, conversation)
            if found is None:
                raise missing_conversation(conversation, "conversation")
            earlier = found
        prompt = None if req.prompt is None else await self._prompt(team, req.prompt)
        return begin(req, raw, earlier, conversation, prompt)

    async def _prompt(self, team: str, asked: PromptRef) -> Prompt:
        """The team's prompt a request names, filled with its variables."""
        version = None if asked.version is None else str(asked.version)
        row = await self.prompts.get(team, asked.id, version)
        if row is None:
            raise missing_prompt(asked.id, "prompt")
        echo = {"id": row.prompt_id, "version": str(row.version), "variables": asked.variables}
        return Prompt(rendered(row, asked.variables), echo)

    async def _keep(self, team: str, turn: Turn, response: dict[str, Any]) -> None:
        """A finished response: stored (`store`), and its input and output added to its
        conversation."""
        if turn.store:
            await self.store.save(team, response, turn.context)
        if turn.conversation is not None:
            added = turn.fresh + list(response.get("output") or ())
            await self.conversations.add(team, turn.conversation, added)

    async def create(self, request: Request) -> Response:
        caller = await self.proxy.auth.caller(request)
        team = caller.team
        turn = await self._turn(team, decode_json(await request.body()))
        if turn.echo["background"]:
            asked = turn.chat.get("tier") or turn.chat.get("priority")
            tier = tier_of(request.headers, asked, caller)
            keep = partial(self._keep, team)
            rid = request_id(request.scope)
            streamed = bool(turn.chat.get("stream"))
            queued = await self.background.start(caller, turn, tier, rid, keep, streamed)
            headers = {"x-request-id": rid}
            if streamed:
                events = self.background.follow(team, turn.id, None)
                return Stream(events, media_type="text/event-stream", headers=headers | SSE_HEADERS)
            return Response(msgspec.json.encode(queued), headers=headers)
        try:
            chat = msgspec.json.encode(turn.chat)
            reply = await self.proxy.handle(request, "chat", chat, responses=turn.native)
        except GatewayError as exc:  # name the field as the client sent it
            exc.param = PARAMS.get(exc.param or "", exc.param)
            raise
        turn.model = reply.headers.get("x-tokenyard-model") or turn.model
        served = self.proxy.router.catalog.get(turn.model)
        native = served is not None and served.provider == "openai"  # answered in kind
        headers = dict(reply.headers)
        keep = partial(self._keep, team)
        if isinstance(reply, Stream):
            headers.pop("content-type", None)
            relay = native_events if native else chat_events
            events = relay(EventWriter(turn), reply, keep)
            return Stream(events, media_type="text/event-stream", headers=headers)
        if reply.status_code != 200:  # the upstream's refusal, already OpenAI's error shape
            return reply
        data = msgspec.json.decode(reply.content)
        response = adopt(turn, data) if native else from_chat(turn, data)
        await keep(turn, response)
        headers.pop("content-length", None)
        return Response(
            msgspec.json.encode(response), media_type="application/json", headers=headers
        )

    async def retrieve(self, request: Request, response_id: str) -> dict[str, Any]:
        """A stored response as it stands (a background one's progress included)."""
        team = (await self.proxy.auth.caller(request)).team
        return await self.background.current(team, await stored(self.store, team, response_id))

    async def events(self, request: Request, response_id: str, after: int | None) -> Stream:
        """A streamed background response's events again, after sequence number `after`."""
        team = (await self.proxy.auth.caller(request)).team
        await stored(self.store, team, response_id)
        if not await self.background.log.kept(team, response_id):
            raise GatewayError(
                400,
                f"response {response_id!r} has no events to stream: only a response created with "
                "background=true and stream=true can be streamed again, for an hour after its "
                "last event",
                param="stream",
            )
        events = self.background.follow(team, response_id, after)
        return Stream(events, media_type="text/event-stream", headers=SSE_HEADERS)

    async def context(self, request: Request, response_id: str) -> list[dict[str, Any]]:
        """The items a stored response was made from (its input_items)."""
        team = (await self.proxy.auth.caller(request)).team
        return (await stored(self.store, team, response_id)).context

    async def cancel(self, request: Request, response_id: str) -> dict[str, Any]:
        team = (await self.proxy.auth.caller(request)).team
        found = await stored(self.store, team, response_id)
        return await self.background.cancel(team, found)

    async def delete(self, request: Request, response_id: str) -> None:
        """Delete a stored response; a background one still running is stopped."""
        team = (await self.proxy.auth.caller(request)).team
        found = await stored(self.store, team, response_id)
        if found.response.get("status") in UNFINISHED:
            await self.background.stop(team, response_id)
        await self.store.delete(team, response_id)
        if found.response.get("background"):
            await self.background.log.delete(team, response_id)

    async def input_tokens(self, request: Request) -> Response[bytes]:
        """OpenAI's input-token count of a Responses request, earlier turns by
        previous_response_id or its conversation included (gateway/token_counts.py)."""
        caller = await self.proxy.auth.caller(request)
        turn = await self._turn(caller.team, decode_json(await request.body()))
        try:
            counted = await count_tokens(
                self.proxy, caller, request_id(request.scope), turn.chat, turn.native
            )
        except GatewayError as exc:
            exc.param = PARAMS.get(exc.param or "", exc.param)
            raise
        body = {"object": "response.input_tokens", "input_tokens": counted.tokens}
        return Response(msgspec.json.encode(body), headers=counted.headers)
