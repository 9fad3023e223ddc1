"""Billing fixtures: usage events, a fake engine that reports engine time, and the gateway fixtures
(Redis, fake upstream, gateways); the databases (SQLite, PostgreSQL) are tests/conftest.py's."""

import sys
import time
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select
from sqlmodel import Session
from sqlmodel import select as sm_select

from tests.gateway.conftest import (  # noqa: F401 - fixtures, by name
    Process,
    base_env,
    data_dir,
    free_port,
    redis_server,
    sql,
    team,
    upstream,
    wait_until,
)
from tokenyard.billing.models import ROLLUP_SUMS, UsageRecord

HERE = Path(__file__).parent
MODEL = "fake"
COMPUTE_S = 0.5  # what the fake engine reports per request
USD_PER_HOUR = 36.0  # so a request costs 0.5 s × $0.01/s = $0.005
PRICE = {"input": 1.0, "cached_input": 0.5, "output": 2.0}  # per 1M: the list-price figure
ADMIN_KEY = "admin-" + uuid.uuid4().hex
CHAT = [{"role": "user", "content": "one two three four #chunks=5"}]
CHARGED = COMPUTE_S * USD_PER_HOUR / 3600


def list_price(prompt: int, cached: int, completion: int) -> float:
    return (
        (prompt - cached) * PRICE["input"]
        + cached * PRICE["cached_input"]
        + completion * PRICE["output"]
    ) / 1e6


def event(**fields: Any) -> dict[str, Any]:
    """A usage event as gateway/proxy.py makes it."""
    return {
        "request_id": "req-" + uuid.uuid4().hex,
        "team": "alpha",
        "model": "m",
        "model_served": "m",
        "tier": "interactive",
        "stream": False,
        "prompt_estimate": 9,
        "prompt_reserved": 10,
        "ts": time.time(),
        "key_prefix": "ty-abcdefghi",
        "status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cached_tokens": 2,
        "e2e": 0.25,
        "timings": {"queue": 0.01, "ttft": 0.05, "compute": 0.2},
        "provider": "self-hosted",
        "usage_reported": True,
        "cost_usd": 0.001,
        "list_cost_usd": 0.002,
        **fields,
    }


def record_sums(
    engine: Engine, team_name: str, day: date | None = None, key_prefix: str | None = None
) -> dict[str, Any]:
    """The rollup columns summed straight from the records (of one day, of one key, or all): what
    the rollups must equal."""
    t = UsageRecord.__table__  # type: ignore[attr-defined]
    columns = [func.count(), func.coalesce(func.sum((t.c.status != 200).cast(t.c.status.type)), 0)]
    columns += [func.coalesce(func.sum(t.c[name]), 0) for name in ROLLUP_SUMS[2:]]
    query = select(*columns).where(t.c.team == team_name)
    if day is not None:
        query = query.where(t.c.day == day)
    if key_prefix is not None:
        query = query.where(t.c.key_prefix == key_prefix)
    with engine.connect() as conn:
        row = conn.execute(query).one()
    return dict(zip(ROLLUP_SUMS, row, strict=True))


def records(engine: Engine, team_name: str) -> list[UsageRecord]:
    with Session(engine) as session:
        return list(session.exec(sm_select(UsageRecord).where(UsageRecord.team == team_name)))


@pytest.fixture(scope="session")
def billing_env(
    base_env: dict[str, str],  # noqa: F811 - the fixture imported above
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, str]]:
    """A fake engine that reports engine time, priced by a catalog of its own."""
    work = tmp_path_factory.mktemp("billing")
    port = free_port()
    command = [sys.executable, str(HERE / "fake_engine.py"), "--port", str(port)]
    engine = Process(
        [*command, "--model", MODEL, "--compute", str(COMPUTE_S)], base_env, work / "engine.log"
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, 20, "fake engine")
    catalog = work / "catalog.toml"
    catalog.write_text(
        f'[[models]]\nid = "{MODEL}"\nprovider = "self-hosted"\nusd_per_hour = {USD_PER_HOUR}\n'
        f"price = {{ input = {PRICE['input']}, cached_input = {PRICE['cached_input']}, "
        f"output = {PRICE['output']} }}\n"
    )
    yield {
        **base_env,
        "TOKENYARD_ENGINE_URLS": f"{MODEL}={url}",
        "TOKENYARD_CATALOG": str(catalog),
        "TOKENYARD_ADMIN_KEY": ADMIN_KEY,
        "TOKENYARD_METRICS_KEY": ADMIN_KEY,  # spend by team is on /metrics only with the key
        "TOKENYARD_BILLING_BLOCK_MS": "50",
        "TOKENYARD_BILLING_CLAIM_IDLE_S": "1",
        "TOKENYARD_BILLING_RETRY_S": "0.1",
        # auth stays cached while the kill test holds SQL locked
        "TOKENYARD_GATEWAY_KEY_CACHE_S": "600",
    }
    engine.stop()
