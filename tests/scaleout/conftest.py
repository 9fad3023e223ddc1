"""The gateway tests' fixtures (real Redis, SQL, teams), shared by name."""

from tests.gateway.conftest import (  # noqa: F401
    base_env,
    data_dir,
    redis_server,
    sql,
    team,
    upstream,
)
