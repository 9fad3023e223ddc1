"""No usage is lost: a gateway is SIGKILLed mid-load while SQL is unavailable (SQLite locked
exclusively; PostgreSQL stopped); afterwards every request a client saw complete has exactly one
record, and the rollups equal the records."""

import os
import signal
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from tests.billing.conftest import MODEL, record_sums, records
from tests.gateway.conftest import Gateway, wait_until
from tokenyard.billing import reports
from tokenyard.billing.models import UsageRecord
from tokenyard.core.db import get_engine
from tokenyard.core.usage import USAGE_STREAM
from tokenyard.tenancy import keys, teams

ROUNDS = 30  # per worker
WORKERS = 4


@dataclass
class Store:
    engine: Engine
    env: dict[str, str]  # the gateways' settings for it
    group: str
    down: Callable[[], None]
    up: Callable[[], None]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, sql: Engine) -> Iterator[Store]:
    if request.param == "sqlite":
        held: list[sqlite3.Connection] = []

        def lock() -> None:  # every write then fails with "database is locked"
            conn = sqlite3.connect(str(sql.url.database), timeout=10)
            conn.execute("BEGIN EXCLUSIVE")
            held.append(conn)

        def unlock() -> None:
            conn = held.pop()
            conn.rollback()
            conn.close()

        yield Store(sql, {}, "billing", lock, unlock)
        return
    server = request.getfixturevalue("postgres")
    url = server.new_database()
    # a deployment of its own: its group records into its own database
    group = "billing-" + uuid.uuid4().hex[:8]
    env = {"TOKENYARD_DATABASE_URL": url, "TOKENYARD_BILLING_CONSUMER_GROUP": group}
    yield Store(get_engine(url), env, group, server.stop, server.start)


def send(gw: Gateway, key: str, stream: bool) -> str | None:
    """One request; its id if the client received the whole response, else None."""
    rid = "kill-" + uuid.uuid4().hex
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "a b c #chunks=3 #delay=0.01"}],
        "max_tokens": 5,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid}
    url = gw.url + "/v1/chat/completions"
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
            data = response.read()
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    complete = data.rstrip().endswith(b"data: [DONE]") if stream else bool(data)
    return rid if complete else None


def held_by(r: Any, group: str, gw: Gateway) -> int:
    """Events pending (read, unacknowledged) at the usage consumer of this gateway's process."""
    consumers = r.xinfo_consumers(USAGE_STREAM, group)
    return sum(c["pending"] for c in consumers if f"-{gw.proc.pid}-" in c["name"].decode())


def test_sigkill_mid_load_with_sql_down_loses_nothing(
    billing_env: dict[str, str], store: Store, tmp_path: Path, redis_server: Any
) -> None:
    name = "kill-" + uuid.uuid4().hex[:8]
    teams.create_team(store.engine, name)
    key = keys.create_key(store.engine, name).key
    env = {**billing_env, **store.env, "TOKENYARD_BILLING_BATCH_SIZE": "8"}
    doomed = Gateway(env, tmp_path / "doomed.log")
    survivor = Gateway(env, tmp_path / "survivor.log")
    r = redis_server.client()
    completed: list[str] = []
    try:
        for gw in (doomed, survivor):  # the key's policy cached before SQL goes away
            rid = send(gw, key, stream=False)
            assert rid is not None
            completed.append(rid)
        wait_until(lambda: len(records(store.engine, name)) == 2, 30, "the warm-up records")

        store.down()
        half = threading.Event()
        appending = threading.Lock()

        def worker(i: int) -> None:
            for j in range(ROUNDS):
                gw = doomed if (i + j) % 2 else survivor
                rid = send(gw, key, stream=j % 3 == 0)
                if rid is not None:
                    with appending:
                        completed.append(rid)
                if j == ROUNDS // 2:
                    half.set()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
        for t in threads:
            t.start()
        half.wait(60)
        # the doomed gateway's consumer holds events it read but cannot commit
        wait_until(lambda: held_by(r, store.group, doomed) > 0, 10, "the doomed one to hold events")
        os.kill(doomed.proc.pid, signal.SIGKILL)
        for t in threads:
            t.join()
        assert held_by(r, store.group, doomed) > 0
        store.up()

        expected = set(completed)
        assert len(expected) > WORKERS * ROUNDS // 3
        wait_until(
            lambda: expected <= {rec.client_request_id for rec in records(store.engine, name)},
            60,
            "a record for every completed request",
        )
        assert held_by(r, store.group, doomed) == 0  # the survivor claimed what the dead one held
    finally:
        doomed.stop()
        survivor.stop()
    table = UsageRecord.__table__  # type: ignore[attr-defined]
    with store.engine.connect() as conn:
        counts = dict(
            conn.execute(
                select(table.c.client_request_id, func.count())
                .where(table.c.team == name)
                .group_by(table.c.client_request_id)
            ).all()
        )
    assert all(counts.get(rid) == 1 for rid in expected)
    day = records(store.engine, name)[0].day
    sums = record_sums(store.engine, name, day)
    rollup = reports.daily(store.engine, day, day, name)
    assert sum(row.requests for row in rollup) == sums["requests"] == len(counts)
    assert sum(row.prompt_tokens for row in rollup) == sums["prompt_tokens"]
    assert sum(row.cost_usd for row in rollup) == pytest.approx(sums["cost_usd"])
