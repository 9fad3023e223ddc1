"""One Upstream per catalog entry, by provider, with its retries and its breaker."""

import asyncio
from collections.abc import Iterable

from redis.asyncio import Redis

from tokenyard.backends.anthropic import AnthropicWire
from tokenyard.backends.anthropic import headers as anthropic_headers
from tokenyard.backends.anthropic_clouds import Cloud
from tokenyard.backends.api import ApiClient, RequestAuth
from tokenyard.backends.aws_auth import AwsSigV4
from tokenyard.backends.base import ModelInfo, Upstream
from tokenyard.backends.breaker import Breaker, BreakerConfig
from tokenyard.backends.checks import PINGS, Check
from tokenyard.backends.converse import ConverseWire
from tokenyard.backends.deployment_limits import DeploymentLimits
from tokenyard.backends.deployments import Deployment, Deployments
from tokenyard.backends.engine import EngineUpstream
from tokenyard.backends.entra import EntraTokens
from tokenyard.backends.gemini import GeminiEmbeddings, GeminiWire
from tokenyard.backends.gemini import headers as gemini_headers
from tokenyard.backends.google_auth import GoogleTokens
from tokenyard.backends.openai import OpenAIUpstream
from tokenyard.backends.registry import Backends
from tokenyard.backends.retry import Guard, RetryPolicy
from tokenyard.backends.translated import TranslatedUpstream
from tokenyard.core.settings import Settings
from tokenyard.router.catalog import AWS, Catalog, DeploymentEntry, ModelEntry


def retry_policy(settings: Settings, entry: ModelEntry) -> RetryPolicy:
    """The platform's timeouts and tries, where the model sets none of its own."""
    return RetryPolicy(
        attempts=entry.retry_attempts or settings.backend_retry_attempts,
        backoff_s=settings.backend_retry_backoff_s,
        backoff_max_s=settings.backend_retry_backoff_max_s,
        retry_after_max_s=settings.backend_retry_after_max_s,
        connect_timeout_s=settings.backend_connect_timeout_s,
        first_token_timeout_s=entry.first_token_timeout_s or settings.backend_first_token_timeout_s,
        read_timeout_s=entry.read_timeout_s or settings.backend_read_timeout_s,
    )


def breaker_config(settings: Settings) -> BreakerConfig:
    return BreakerConfig(
        failures=settings.backend_breaker_failures,
        error_rate=settings.backend_breaker_error_rate,
        min_requests=settings.backend_breaker_min_requests,
        window_s=settings.backend_breaker_window_s,
        open_s=settings.backend_breaker_open_s,
        probe_s=settings.backend_breaker_probe_s,
    )


def _auth(deployment: DeploymentEntry) -> dict[str, str]:
    key = deployment.api_key
    if not key:  # a token or a signature with each request (ApiClient's auth)
        return {}
    if deployment.provider == "azure":  # its deployments take the key in their own header
        return {"api-key": key}
    if deployment.provider == "anthropic":
        return anthropic_headers(key)
    if deployment.provider == "gemini":
        return gemini_headers(key)
    return {"authorization": f"Bearer {key}"}  # OpenAI's keys, and Bedrock's API keys


def _deployment(d: DeploymentEntry, policy: RetryPolicy, connections: int) -> Deployment:
    query = f"?api-version={d.api_version}" if d.api_version else ""
    api = ApiClient(d.base_url, _auth(d), policy, connections, _signer(d))
    cloud: Cloud = d.provider if d.provider in ("vertex", "bedrock") else ""  # type: ignore[assignment]
    tags = frozenset(d.tags)
    return Deployment(d.label, api, d.upstream_model, query, d.weight, tags, cloud, d.rpm, d.tpm)


def _signer(d: DeploymentEntry) -> RequestAuth | None:
    """What proves a deployment's requests where it takes no fixed key."""
    if d.api_key_env:
        return None
    if d.provider == "vertex":
        return GoogleTokens()
    if d.provider in AWS:
        return AwsSigV4(d.region)
    if d.entra is not None:
        return EntraTokens(d.entra.tenant_id, d.entra.client_id, d.entra.client_secret_env)
    return None


def build_upstream(entry: ModelEntry, redis: Redis, settings: Settings) -> Upstream:
    """The backend for a configured catalog entry (`entry.configured`)."""
    info = ModelInfo(
        name=entry.id,
        provider=entry.provider,
        max_model_len=entry.max_context,
        max_tokens_param=entry.max_tokens_param,
    )
    policy = retry_policy(settings, entry)
    guard = Guard(info, policy, Breaker(entry.id, redis, breaker_config(settings)))
    if entry.provider == "self-hosted":
        if not entry.base_urls:
            raise ValueError(f"{entry.id}: no base_urls")
        return EngineUpstream(
            info,
            entry.base_urls,
            guard,
            cooldown_s=settings.backend_replica_cooldown_s,
            affinity_margin=settings.backend_affinity_margin,
            affinity_chars=settings.backend_affinity_chars,
        )
    connections = settings.backend_max_connections
    live = [_deployment(d, policy, connections) for d in entry.live_deployments]
    if not live:
        raise ValueError(f"{entry.id}: no deployment with its API key set or Entra ID")
    guard.set_reachable(True)
    limited = any(d.rpm or d.tpm for d in live)
    deployments = Deployments(
        live,
        guard,
        settings.backend_replica_cooldown_s,
        settings.backend_affinity_margin,
        settings.backend_affinity_chars,
        limits=DeploymentLimits(entry.id, redis) if limited else None,
    )
    adaptive = entry.thinking == "adaptive"
    if entry.wire == "anthropic":
        return TranslatedUpstream(info, deployments, AnthropicWire(adaptive))
    if entry.wire == "gemini" and entry.kind == "embedding":
        return GeminiEmbeddings(info, deployments)
    if entry.wire == "gemini":
        return TranslatedUpstream(info, deployments, GeminiWire())
    if entry.wire == "converse":
        return TranslatedUpstream(info, deployments, ConverseWire(adaptive))
    return OpenAIUpstream(info, deployments)


def build_backends(catalog: Catalog, redis: Redis, settings: Settings) -> Backends:
    """One backend per model the platform can call (replicas known, or its API key set)."""
    upstreams: dict[str, Upstream] = {
        m.id: build_upstream(m, redis, settings) for m in catalog.models.values() if m.configured
    }
    return Backends(upstreams)


async def check_models(
    catalog: Catalog, backends: Backends, names: Iterable[str] = ()
) -> list[Check]:
    """Every configured model's places (or those of the models `names` names), each tried once
    with the smallest request of its kind, all at once (backends/checks.py). Image models are
    left out (the smallest image still costs cents), and transcription models (a check would
    upload audio). ValueError names the models that are not
    configured, or not checked."""
    asked = list(dict.fromkeys(catalog.resolve(n) for n in names))
    checked = [n for n in backends.upstreams if catalog.models[n].kind in PINGS]
    wanted = asked or checked
    unknown = [n for n in wanted if n not in checked]
    if unknown:
        raise ValueError(f"no such model configured, or not checked: {', '.join(unknown)}")
    found = await asyncio.gather(
        *(backends.upstreams[n].check(catalog.models[n].kind) for n in wanted)
    )
    return [one for checks in found for one in checks]
