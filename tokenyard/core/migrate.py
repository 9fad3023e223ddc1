"""Schema migrations (Alembic, core/migrations) for every table of the platform.

`upgrade` runs at startup wherever an engine is opened (core/db.py get_engine): a database made
before migrations existed (tables from create_all, no version) is stamped at the first revision,
which matches them, then upgraded.
"""

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect, text

MIGRATIONS = Path(__file__).parent / "migrations"
_BASELINE = "0001"  # the gateway's teams and keys, as create_all used to make them


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


@contextlib.contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """Gateways starting together on one SQLite file: one migrates, the others wait on a lock file
    beside it (PostgreSQL uses an advisory lock instead)."""
    path = engine.url.database
    if engine.dialect.name != "sqlite" or not path or path == ":memory:":
        yield
        return
    with open(path + ".migrate-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to `revision` (an older one: tests of a migration's data steps)."""
    config = _config()
    with _sqlite_file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # gateways starting together: one migrates, the others wait and find it done
            conn.execute(text("SELECT pg_advisory_xact_lock(7242011)"))
        config.attributes["connection"] = conn
        tables = inspect(conn).get_table_names()
        if "team" in tables and "alembic_version" not in tables:
            command.stamp(config, _BASELINE)
        command.upgrade(config, revision)
