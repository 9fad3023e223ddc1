"""`POST /v1/messages`: Anthropic's Messages API over any catalog model. The request is translated
onto a chat completion (backends/anthropic_messages.py) and walked like any other (keys, quotas,
routing with `auto`, fallbacks, billing: gateway/proxy.py); the reply, whole or streamed, is
translated back, and every refusal leaves in Anthropic's error shape. The team key comes as
`x-api-key` (Anthropic's SDK) or `Authorization: Bearer`. `POST /v1/messages/count_tokens` counts
a request's prompt for its model without running it (gateway/token_counts.py)."""

from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from tokenyard.backends.anthropic_messages import (
    EventWriter,
    chat_request,
    error_body,
    error_from_openai,
    message_reply,
)
from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.request_ids import request_id
from tokenyard.gateway.token_counts import count_tokens
from tokenyard.gateway.translated_stream import translated
from tokenyard.gateway.validation import decode_json


class MessagesRequest(msgspec.Struct, kw_only=True):
    """Anthropic's Messages request, as documented for the schema (the translation checks it)."""

    model: str
    max_tokens: int
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    """Anthropic's count_tokens request: a Messages request without the output's settings."""

    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


def _headers(given: Mapping[str, str]) -> dict[str, str]:
    dropped = ("content-type", "content-length")
    headers = {k: v for k, v in given.items() if k not in dropped}
    if "x-request-id" in headers:  # where Anthropic's SDK reads a response's id
        headers["request-id"] = headers["x-request-id"]
    return headers


def _error(status: int, body: dict[str, Any], headers: dict[str, str]) -> Response[bytes]:
    encoded = msgspec.json.encode(body)
    return Response(encoded, status_code=status, media_type="application/json", headers=headers)


class MessagesController(Controller):
    path = "/v1"

    @post("/messages", status_code=200, operation_class=json_body(MessagesRequest))
    async def create(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        try:
            chat = chat_request(decode_json(await request.body()))
            reply = await proxy.handle(request, "chat", msgspec.json.encode(chat))
        except GatewayError as exc:
            return _error(exc.status, error_body(exc.status, exc.message), exc.headers())
        headers = _headers(reply.headers)
        model = headers.get("x-tokenyard-model") or chat["model"]
        if isinstance(reply, Stream):
            stream = translated(reply, EventWriter(model))
            return Stream(stream, media_type="text/event-stream", headers=headers)
        if reply.status_code != 200:  # the upstream's refusal, in OpenAI's shape
            body = error_from_openai(reply.status_code, reply.content)
            return _error(reply.status_code, body, headers)
        message = message_reply(msgspec.json.decode(reply.content), model)
        encoded = msgspec.json.encode(message)
        return Response(encoded, media_type="application/json", headers=headers)

    @post("/messages/count_tokens", status_code=200, operation_class=json_body(CountTokensRequest))
    async def count_tokens(
        self, request: Request, proxy: NamedDependency[Proxy]
    ) -> Response[bytes]:
        """The prompt's tokens for the model named (gateway/token_counts.py), without running it."""
        try:
            policy = await proxy.auth.caller(request)
            body = decode_json(await request.body())
            if not isinstance(body, dict):
                raise GatewayError(400, "the request body must be a JSON object", param="body")
            # the translation wants an output cap and a stream flag: counting uses neither
            chat = chat_request({**body, "max_tokens": 1, "stream": False})
            del chat["max_tokens"]
            counted = await count_tokens(proxy, policy, request_id(request.scope), chat)
        except GatewayError as exc:
            return _error(exc.status, error_body(exc.status, exc.message), exc.headers())
        headers = _headers(counted.headers)
        encoded = msgspec.json.encode({"input_tokens": counted.tokens})
        return Response(encoded, media_type="application/json", headers=headers)
