"""The gateway's own routes: legacy completions, embeddings, images, audio, models, health,
readiness and metrics (chat completions: gateway/chats; the app that serves them with every other
package's is assembled in tokenyard/app.py)."""

from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from tokenyard.backends.anthropic_messages import error_body
from tokenyard.backends.base import Upstream
from tokenyard.core.errors import GatewayError
from tokenyard.core.metrics import exposition
from tokenyard.core.openapi import body_operation, json_body
from tokenyard.core.settings import Settings
from tokenyard.gateway.audio import MAX_FORM_BYTES
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.validation import (
    CompletionRequest,
    EmbeddingRequest,
    ImageRequest,
    RerankRequest,
    SpeechRequest,
    query_int,
)
from tokenyard.router.catalog import ModelEntry
from tokenyard.router.policy import AUTO
from tokenyard.tenancy.policy import TeamPolicy

ANTHROPIC_VERSION = "anthropic-version"  # the header Anthropic's clients send on every request
# an audio upload's form, for the OpenAPI document (gateway/audio.py reads it; the provider
# checks the fields it does not name)
_AUDIO_FORM = {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "model": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string"},
        "temperature": {"type": "number"},
    },
}
_AUDIO = body_operation("multipart/form-data", _AUDIO_FORM)


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


class CompletionsController(Controller):
    path = "/v1"

    @post("/completions", status_code=200, operation_class=json_body(CompletionRequest))
    async def completions(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        return await proxy.handle(request, "completion")

    @post("/embeddings", status_code=200, operation_class=json_body(EmbeddingRequest))
    async def embeddings(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        return await proxy.handle(request, "embedding")

    @post("/images/generations", status_code=200, operation_class=json_body(ImageRequest))
    async def images(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        return await proxy.handle(request, "image")

    @post("/audio/speech", status_code=200, operation_class=json_body(SpeechRequest))
    async def speech(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        return await proxy.handle(request, "speech")

    @post(
        ["/audio/transcriptions", "/audio/translations"],
        status_code=200,
        operation_class=_AUDIO,
        request_max_body_size=MAX_FORM_BYTES,
    )
    async def audio_to_text(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        translating = request.url.path.endswith("/translations")
        return await proxy.handle(request, "translation" if translating else "transcription")

    @get("/models")
    async def models(
        self, request: Request, proxy: NamedDependency[Proxy], caller: NamedDependency[TeamPolicy]
    ) -> Response[bytes]:
        cards = team_models(proxy, caller)
        if ANTHROPIC_VERSION in request.headers:  # Anthropic's client: its list, paged its way
            return _json(_anthropic_page(request, [_anthropic_card(c) for c in cards]))
        return _json({"object": "list", "data": cards})

    @get("/models/{model_id:path}")
    async def model(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        caller: NamedDependency[TeamPolicy],
        model_id: FromPath[str],
    ) -> Response[bytes]:
        model_id = proxy.router.catalog.resolve(model_id.lstrip("/"))
        anthropic = ANTHROPIC_VERSION in request.headers
        for card in team_models(proxy, caller):
            if card["id"] == model_id:
                return _json(_anthropic_card(card) if anthropic else card)
        message = f"the model {model_id!r} does not exist"
        if anthropic:
            return _json(error_body(404, message), 404)
        raise GatewayError(404, message, code="model_not_found", param="model")


def team_models(proxy: Proxy, policy: TeamPolicy) -> list[dict[str, Any]]:
    """The models the calling team may use (allowed, with a deployment its tags allow), cheapest
    first, then "auto"."""
    data = [
        _model_card(m, proxy.backends.get(m.id))
        for m in proxy.router.catalog.by_price()
        if (not policy.models or m.id in policy.models) and m.serves_tags(policy.deployment_tags)
    ]
    if data:  # "auto" routes among the models the team may use
        data.append({"id": AUTO, "object": "model", "created": 0, "owned_by": "tokenyard"})
    return data


def _anthropic_card(card: dict[str, Any]) -> dict[str, Any]:
    """A model card as Anthropic's Models API gives it (no release date here: the epoch, as its
    documentation allows)."""
    return {
        "type": "model",
        "id": card["id"],
        "display_name": card["id"],
        "created_at": "1970-01-01T00:00:00Z",
        "max_input_tokens": card.get("max_model_len") or None,
    }


def _anthropic_page(request: Request, data: list[dict[str, Any]]) -> dict[str, Any]:
    """Anthropic's page over the list: `limit` (1-1000, default 20), `after_id`, `before_id`."""
    q = request.query_params
    limit, ids = query_int(q, "limit", 1, 1000, 20), [card["id"] for card in data]
    start, end = 0, len(data)
    if (after := q.get("after_id")) in ids:
        start = ids.index(after) + 1
    if (before := q.get("before_id")) in ids:
        end = ids.index(before)
        start = max(start, end - limit)
    page = data[start:end][:limit]
    return {
        "data": page,
        "has_more": start + len(page) < end if before is None else start > 0,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


def _model_card(entry: ModelEntry, upstream: Upstream | None) -> dict[str, Any]:
    """OpenAI's model object, with what the catalog and the backend's live state say of it."""
    info = upstream.info if upstream else None
    return {
        "id": entry.id,
        "object": "model",
        "created": 0,
        "owned_by": entry.provider,
        "available": upstream is not None,  # configured: replicas known or its API key set
        "ready": bool(info and info.ready),
        "circuit": info.circuit if info else None,
        "max_model_len": (info.max_model_len if info else 0) or entry.max_context,
        "kind": entry.kind,  # chat, embedding (/v1/embeddings) or rerank (/v1/rerank)
        "rerank": entry.serves("rerank"),
        "capability": entry.capability,
        "supports": msgspec.to_builtins(entry.supports),  # what requests it can honour
        "tiers": list(entry.tiers),
        "pricing": entry.price.listed,
        "fallbacks": list(entry.fallbacks),
        "context_fallbacks": list(entry.context_fallbacks),  # for prompts its window cannot hold
        "aliases": list(entry.aliases),  # other names requests may use for it
    }


class RerankController(Controller):
    """Cohere's, Jina's and vLLM's rerank: /v1/rerank, and /v2/rerank where Cohere's v2 client
    sends it (the same body)."""

    @post(["/v1/rerank", "/v2/rerank"], status_code=200, operation_class=json_body(RerankRequest))
    async def rerank(self, request: Request, proxy: NamedDependency[Proxy]) -> Response:
        return await proxy.handle(request, "rerank")


class OpsController(Controller):
    @get("/health")
    async def health(self) -> Response[bytes]:
        return _json({"status": "ok"})

    @get("/ready")
    async def ready(self, proxy: NamedDependency[Proxy]) -> Response[bytes]:
        """Ready when Redis answers and at least one model is ready."""
        try:
            redis_ok = bool(await proxy.quotas.redis.ping())
        except RedisError:
            redis_ok = False
        models = {name: u.info.ready for name, u in proxy.backends.upstreams.items()}
        ok = (redis_ok or proxy.settings.gateway_fail_open) and any(models.values())
        return _json({"ready": ok, "redis": redis_ok, "models": models}, 200 if ok else 503)

    @get("/metrics")
    async def metrics(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        """Prometheus' scrape; team-labelled series only with the metrics key (core/metrics.py)."""
        key = settings.metrics_key.get_secret_value()
        body = exposition(request.headers.get("authorization"), key)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
