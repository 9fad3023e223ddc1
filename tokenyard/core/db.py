"""The SQL engine every package shares (sqlmodel over SQLAlchemy): SQLite by default, PostgreSQL
via TOKENYARD_DATABASE_URL. Opening it runs the platform's migrations (core/migrations)."""

import json
import os
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine
from sqlmodel import create_engine

from tokenyard.core.migrate import upgrade
from tokenyard.core.settings import Settings


def database_url(settings: Settings) -> str:
    url = settings.database_url.get_secret_value()
    if url:
        # the driver installed is psycopg 3: a plain postgres URL would ask for psycopg2
        scheme, _, rest = url.partition("://")
        return f"postgresql+psycopg://{rest}" if scheme in ("postgres", "postgresql") else url
    os.makedirs(settings.data_dir, exist_ok=True)
    return f"sqlite:///{os.path.abspath(settings.data_dir)}/tokenyard.db"


def matchable(*values: str | None) -> bool:
    """False when a value holds NUL: PostgreSQL's text can neither store nor compare it (the query
    fails), and no stored row holds one, so a lookup by such a value finds nothing."""
    return not any(value and "\x00" in value for value in values)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@lru_cache
def get_engine(url: str) -> Engine:
    # check_same_thread: the gateway reads SQLite from a worker thread on cache misses
    connect_args = {"check_same_thread": False} if url.startswith("sqlite") else {}
    engine = create_engine(
        url,
        connect_args=connect_args,
        pool_pre_ping=True,
        # JSON columns keep text as written: SQLite's JSON paths match a key's characters, not
        # the \u escapes json.dumps would write for anything outside ASCII
        json_serializer=_json_text,
    )
    upgrade(engine)  # the schema, these tables included, is Alembic's (core/migrations)
    return engine
