"""The engine's HTTP server: OpenAI routes, /tokenize and /detokenize, /health, /load, /metrics
(docs/engine-protocol.md). What the routes do is engine/serving.py's; here are the routes and
the error handlers."""

import logging

from litestar import Controller, Litestar, MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.response import Stream
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tokenyard.core.openapi import json_body, openapi_config
from tokenyard.engine.async_engine import AsyncEngine, EngineStopped
from tokenyard.engine.outputs import RequestError
from tokenyard.engine.protocol import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadAdapterRequest,
    TokenizeRequest,
    UnloadAdapterRequest,
    decode_body,
)
from tokenyard.engine.serving import Disconnected, OpenAIServing, error_body

log = logging.getLogger(__name__)


def _serving(request: Request) -> OpenAIServing:
    return request.app.state.serving


class CompletionsController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200, operation_class=json_body(ChatRequest))
    async def chat_completions(self, request: Request) -> Response | Stream:
        body = decode_body(await request.body(), ChatRequest)
        return await _serving(request).chat(request, body)

    @post("/completions", status_code=200, operation_class=json_body(CompletionRequest))
    async def completions(self, request: Request) -> Response | Stream:
        body = decode_body(await request.body(), CompletionRequest)
        return await _serving(request).completion(request, body)

    @get("/models")
    async def models(self, request: Request) -> dict:
        return {"object": "list", "data": _serving(request).models()}

    @post("/load_lora_adapter", status_code=200, operation_class=json_body(LoadAdapterRequest))
    async def load_lora_adapter(self, request: Request) -> dict:
        return await _serving(request).load_adapter(await request.body())

    @post("/unload_lora_adapter", status_code=200, operation_class=json_body(UnloadAdapterRequest))
    async def unload_lora_adapter(self, request: Request) -> dict:
        return _serving(request).unload_adapter(await request.body())


class TokensController(Controller):
    """vLLM's /tokenize and /detokenize: what a prompt costs in this model's tokens."""

    @post("/tokenize", status_code=200, operation_class=json_body(TokenizeRequest))
    async def tokenize(self, request: Request) -> dict:
        return _serving(request).tokenize(await request.body())

    @post("/detokenize", status_code=200, operation_class=json_body(DetokenizeRequest))
    async def detokenize(self, request: Request) -> dict:
        return _serving(request).detokenize(await request.body())


class OpsController(Controller):
    @get("/health")
    async def health(self, request: Request) -> dict:
        return {"status": "ok", "model": _serving(request).model_name}

    @get("/load")
    async def load(self, request: Request) -> dict:
        return _serving(request).core.load()

    @get("/metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics(self, request: Request) -> bytes:
        return generate_latest(_serving(request).core.metrics.registry)


def create_app(engine: AsyncEngine) -> Litestar:
    return Litestar(
        route_handlers=[CompletionsController, TokensController, OpsController],
        state=State({"serving": OpenAIServing(engine)}),
        exception_handlers={
            RequestError: _request_error,
            HTTPException: _http_error,
            EngineStopped: _stopped,
            Disconnected: _disconnected,
            Exception: _internal_error,
        },
        on_shutdown=[engine.stop],
        request_max_body_size=8 * 2**20,
        openapi_config=openapi_config("tokenyard engine", bearer=False),
    )


def _json_error(status: int, body: bytes) -> Response:
    return Response(body, status_code=status, media_type=MediaType.JSON)


def _request_error(_: Request, exc: RequestError) -> Response:
    return _json_error(400, error_body(exc.message, "invalid_request_error", exc.param, exc.code))


def _http_error(_: Request, exc: HTTPException) -> Response:
    extra = exc.extra if isinstance(exc.extra, dict) else {}
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return _json_error(
        exc.status_code, error_body(exc.detail, kind, extra.get("param"), extra.get("code"))
    )


def _stopped(_: Request, exc: EngineStopped) -> Response:
    return _json_error(503, error_body(str(exc), "server_error", code="engine_stopping"))


def _disconnected(_: Request, __: Disconnected) -> Response:
    return _json_error(499, error_body("client closed the request", "invalid_request_error"))


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return _json_error(500, error_body("internal error in the engine server", "server_error"))
