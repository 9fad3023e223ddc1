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


@lru_cache
def get_settings() -> Settings:
    return Settings()
