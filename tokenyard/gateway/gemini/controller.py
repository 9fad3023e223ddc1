"""Google's Gemini API over any catalog model: `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent?alt=sse` and `:countTokens`; `:embedContent` and `:batchEmbedContents`
on the embedding models; `GET /v1beta/models[/{model}]`.

A request is translated onto a chat completion (gateway/gemini/translate.py) and walked like any
other (keys, quotas, routing with `auto`, fallbacks, billing: gateway/proxy.py); the reply, whole
or streamed, is translated back, and every refusal leaves in Google's error shape. The team key
comes as `x-goog-api-key` (Google's SDKs) or `Authorization: Bearer`; never in the URL, where
proxies and access logs would keep it.
"""

from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream

from tokenyard.backends import sse
from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.gateway.controllers import team_models
from tokenyard.gateway.gemini.cache_store import CacheStore, missing_cache, with_cache
from tokenyard.gateway.gemini.events import StreamWriter
from tokenyard.gateway.gemini.translate import (
    as_object,
    blocked_reply,
    chat_request,
    embeddings_reply,
    embeddings_request,
    error_body,
    error_from_openai,
    field,
    gemini_reply,
)
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.request_ids import request_id
from tokenyard.gateway.token_counts import count_tokens
from tokenyard.gateway.translated_stream import translated
from tokenyard.gateway.validation import decode_json

GENERATE, STREAM, COUNT = "generateContent", "streamGenerateContent", "countTokens"
EMBED, EMBED_BATCH = "embedContent", "batchEmbedContents"


class GenerateContentRequest(msgspec.Struct, kw_only=True, rename="camel"):
    """Gemini's request, as documented for the schema (the translation checks it); countTokens
    takes its `contents`, or a whole request as `generateContentRequest`."""

    contents: list[dict[str, Any]]
    system_instruction: dict[str, Any] | str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_config: dict[str, Any] | None = None
    generation_config: dict[str, Any] | None = None
    safety_settings: list[dict[str, Any]] | None = None
    labels: dict[str, str] | None = None


def reply_json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    encoded = msgspec.json.encode(data)
    return Response(encoded, status_code=status, media_type="application/json", headers=headers)


def reply_error(exc: GatewayError) -> Response:
    return reply_json(error_body(exc.status, exc.message), exc.status, exc.headers())


def _headers(given: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in given.items() if k not in ("content-type", "content-length")}


def _model_object(card: dict[str, Any]) -> dict[str, Any]:
    """A catalog model as Gemini's Model resource."""
    window = card.get("max_model_len") or 0
    return {
        "name": f"models/{card['id']}",
        "baseModelId": card["id"],
        "version": "1",
        "displayName": card["id"],
        "description": f"{card['id']} through tokenyard",
        "inputTokenLimit": window,
        "outputTokenLimit": window,
        "supportedGenerationMethods": (
            [EMBED, EMBED_BATCH] if card.get("kind") == "embedding" else [GENERATE, STREAM, COUNT]
        ),
    }


async def _with_cache(
    request: Request, proxy: Proxy, model: str, body: dict[str, Any], name: Any
) -> dict[str, Any]:
    """A request naming one of its team's caches (`cachedContent`), with the cache's contents."""
    policy = await proxy.auth.caller(request)
    cache = await CacheStore(proxy.quotas.redis).get(policy.team, str(name))
    if cache is None:
        raise missing_cache(str(name))
    return with_cache(as_object(body, "body"), cache, proxy.router.catalog.resolve(model))


class GeminiController(Controller):
    path = "/v1beta/models"

    @get("")
    async def list_models(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        try:
            policy = await proxy.auth.caller(request)
        except GatewayError as exc:
            return reply_error(exc)
        return reply_json({"models": [_model_object(c) for c in team_models(proxy, policy)]})

    @get("/{name:str}")
    async def get_model(
        self, request: Request, proxy: NamedDependency[Proxy], name: FromPath[str]
    ) -> Response:
        try:
            policy = await proxy.auth.caller(request)
        except GatewayError as exc:
            return reply_error(exc)
        wanted = proxy.router.catalog.resolve(name.removeprefix("models/"))
        for card in team_models(proxy, policy):
            if card["id"] == wanted:
                return reply_json(_model_object(card))
        return reply_error(GatewayError(404, f"model {name!r} is not found", param="model"))

    @post("/{call:str}", status_code=200, operation_class=json_body(GenerateContentRequest))
    async def call(
        self, request: Request, proxy: NamedDependency[Proxy], call: FromPath[str]
    ) -> Response:
        """`{model}:{method}`, the form Google's API takes."""
        model, _, method = call.rpartition(":")
        try:
            body = decode_json(await request.body())
            if isinstance(body, dict) and (cached := field(body, "cachedContent")) is not None:
                body = await _with_cache(request, proxy, model, body, cached)
            if method == COUNT:
                return await self._count(request, proxy, model, body)
            if method in (EMBED, EMBED_BATCH):
                return await self._embed(request, proxy, model, body, method == EMBED_BATCH)
            if method not in (GENERATE, STREAM):
                raise GatewayError(404, f"method {method!r} is not found", param="method")
            stream = method == STREAM
            if stream and request.query_params.get("alt") != "sse":
                raise GatewayError(400, "streamGenerateContent is served as alt=sse", param="alt")
            chat = chat_request(body, model, stream)
            reply = await proxy.handle(request, "chat", msgspec.json.encode(chat))
        except GatewayError as exc:
            if exc.code != "content_policy_violation":
                return reply_error(exc)
            blocked = blocked_reply(model)  # Gemini's own answer to a blocked prompt
            if method == STREAM:
                return Stream([sse.data(blocked)], media_type="text/event-stream")
            return reply_json(blocked, headers=exc.headers())
        headers = _headers(reply.headers)
        served = headers.get("x-tokenyard-model") or model
        if isinstance(reply, Stream):
            events = translated(reply, StreamWriter(served))
            return Stream(events, media_type="text/event-stream", headers=headers)
        if reply.status_code != 200:  # the upstream's refusal, in OpenAI's shape
            body = error_from_openai(reply.status_code, reply.content)
            return reply_json(body, reply.status_code, headers)
        return reply_json(gemini_reply(msgspec.json.decode(reply.content), served), headers=headers)

    async def _embed(
        self, request: Request, proxy: Proxy, model: str, body: Any, batch: bool
    ) -> Response:
        """Embeddings from the catalog's embedding models (POST /v1/embeddings' walk)."""
        asked = embeddings_request(body, model, batch)
        reply = await proxy.handle(request, "embedding", msgspec.json.encode(asked))
        headers = _headers(reply.headers)
        if reply.status_code != 200:
            return reply_json(
                error_from_openai(reply.status_code, reply.content), reply.status_code
            )
        return reply_json(
            embeddings_reply(msgspec.json.decode(reply.content), batch), headers=headers
        )

    async def _count(self, request: Request, proxy: Proxy, model: str, body: Any) -> Response:
        """The prompt's tokens for the model named (gateway/token_counts.py), without running it:
        `contents` alone, or a whole `generateContentRequest`."""
        policy = await proxy.auth.caller(request)
        if isinstance(body, dict) and field(body, "generateContentRequest") is not None:
            body = field(body, "generateContentRequest")
        chat = chat_request(body, model, stream=False)
        counted = await count_tokens(proxy, policy, request_id(request.scope), chat)
        return reply_json({"totalTokens": counted.tokens}, headers=_headers(counted.headers))
