"""Gemini's `/v1beta/cachedContents`: a team's context caches (gateway/gemini/cache_store.py),
created, listed, read, given a new expiry and deleted as Google's API does, with its errors'
shape. A generateContent request names one as `cachedContent` (gateway/gemini/controller.py)."""

from typing import Any

import msgspec
from litestar import Controller, Request, Response, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from tokenyard.core.errors import GatewayError
from tokenyard.gateway.controllers import team_models
from tokenyard.gateway.gemini.cache_store import CacheStore, held_by, missing_cache
from tokenyard.gateway.gemini.controller import reply_error, reply_json
from tokenyard.gateway.gemini.translate import as_object, chat_request
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.validation import decode_json, parse


async def _body(request: Request) -> dict[str, Any]:
    return as_object(decode_json(await request.body()), "body")


class CachesController(Controller):
    path = "/v1beta/cachedContents"

    @post("", status_code=200)
    async def create(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        """A cache of `contents` (and `systemInstruction`, `tools`, `toolConfig`) for one of the
        team's models, for `ttl` or until `expireTime`."""
        try:
            policy = await proxy.auth.caller(request)
            body = await _body(request)
            asked = str(body.get("model") or "").removeprefix("models/")
            model = proxy.router.catalog.resolve(asked)
            if model not in {card["id"] for card in team_models(proxy, policy)}:
                raise GatewayError(404, f"model {asked!r} is not found", param="model")
            held = held_by(body)
            # checked as a request would be, and sized by the gateway's estimate
            chat = chat_request(held, model, stream=False)
            tokens = parse(msgspec.json.encode(chat), "chat").prompt_tokens
            store = CacheStore(proxy.quotas.redis)
            return reply_json(await store.create(policy.team, model, held, tokens, body))
        except GatewayError as exc:
            return reply_error(exc)

    @get("")
    async def list_caches(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        try:
            policy = await proxy.auth.caller(request)
        except GatewayError as exc:
            return reply_error(exc)
        listed = await CacheStore(proxy.quotas.redis).listed(policy.team)
        return reply_json({"cachedContents": listed} if listed else {})

    @get("/{cache_id:str}")
    async def retrieve(
        self, request: Request, proxy: NamedDependency[Proxy], cache_id: FromPath[str]
    ) -> Response:
        try:
            policy = await proxy.auth.caller(request)
            cache = await CacheStore(proxy.quotas.redis).get(policy.team, cache_id)
            if cache is None:
                raise missing_cache(cache_id)
        except GatewayError as exc:
            return reply_error(exc)
        return reply_json(cache)

    @patch("/{cache_id:str}")
    async def update(
        self, request: Request, proxy: NamedDependency[Proxy], cache_id: FromPath[str]
    ) -> Response:
        """A new expiry (`ttl` or `expireTime`): the only thing a cache lets change."""
        try:
            policy = await proxy.auth.caller(request)
            store = CacheStore(proxy.quotas.redis)
            cache = await store.extend(policy.team, cache_id, await _body(request))
            if cache is None:
                raise missing_cache(cache_id)
        except GatewayError as exc:
            return reply_error(exc)
        return reply_json(cache)

    @delete("/{cache_id:str}", status_code=200)
    async def remove(
        self, request: Request, proxy: NamedDependency[Proxy], cache_id: FromPath[str]
    ) -> Response:
        try:
            policy = await proxy.auth.caller(request)
            if not await CacheStore(proxy.quotas.redis).delete(policy.team, cache_id):
                raise missing_cache(cache_id)
        except GatewayError as exc:
            return reply_error(exc)
        return reply_json({})
