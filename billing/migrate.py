"""Schema migrations (Alembic, billing/migrations) for every table of the platform.

`upgrade` runs at startup wherever an engine is opened (gateway/db.py get_engine): a database made
before migrations existed (tables from create_all, no version) is stamped at the first revision,
which matches them, then upgraded.
"""

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


def upgrade(engine: Engine) -> None:
    config = _config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # gateways starting together: one migrates, the others wait and find it done
            conn.execute(text("SELECT pg_advisory_xact_lock(7242011)"))
        config.attributes["connection"] = conn
        tables = inspect(conn).get_table_names()
        if "team" in tables and "alembic_version" not in tables:
            command.stamp(config, _BASELINE)
        command.upgrade(config, "head")
