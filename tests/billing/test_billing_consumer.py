"""The usage consumer in process, against a real Redis and SQLite: nothing acknowledged before
its commit, re-delivery recorded once, a dead consumer's pending entries claimed, the stream
trimmed only below acknowledged entries."""

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis
from sqlalchemy import Engine

from tests.billing.conftest import event, records
from tokenyard.billing.consumer import DEAD_STREAM, UsageConsumer
from tokenyard.core.db import get_engine
from tokenyard.core.settings import Settings


@pytest.fixture
async def redis(redis_server: Any) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Engine:
    return get_engine(f"sqlite:///{tmp_path}/usage.db")


def consumer(redis: aioredis.Redis, sql: Engine, stream: str, **settings: Any) -> UsageConsumer:
    defaults = {"billing_block_ms": 20, "billing_retry_s": 0.05, "billing_batch_size": 10}
    return UsageConsumer(redis, sql, Settings(**{**defaults, **settings}), stream=stream)


async def publish(redis: aioredis.Redis, stream: str, *events: dict) -> None:
    for ev in events:
        await redis.xadd(stream, {"event": msgspec.json.encode(ev)})


async def test_redelivery_and_malformed_events(redis: aioredis.Redis, sqlite_db: Engine) -> None:
    stream = "test-usage-" + uuid.uuid4().hex
    team = "t-" + uuid.uuid4().hex[:8]
    first, second = event(team=team), event(team=team)
    await publish(redis, stream, first, first, second)
    await redis.xadd(stream, {"event": b"{not json"})
    await publish(redis, stream, second)
    c = consumer(redis, sqlite_db, stream)
    await c.ensure_group()
    assert await c.step() == 5
    assert sorted(r.request_id for r in records(sqlite_db, team)) == sorted(
        [first["request_id"], second["request_id"]]
    )
    assert (await redis.xpending(stream, c.group))["pending"] == 0  # all acknowledged


async def test_nothing_is_acknowledged_while_sql_is_down(
    redis: aioredis.Redis, sqlite_db: Engine
) -> None:
    stream = "test-usage-" + uuid.uuid4().hex
    team = "t-" + uuid.uuid4().hex[:8]
    await publish(redis, stream, *(event(team=team) for _ in range(3)))
    c = consumer(redis, sqlite_db, stream)
    await c.ensure_group()
    lock = sqlite3.connect(str(sqlite_db.url.database), timeout=0)
    lock.execute("BEGIN EXCLUSIVE")  # SQL unavailable: every write fails with "locked"
    sqlite_db.dispose()
    task = asyncio.create_task(c.step())
    pending: dict = {}
    for _ in range(100):
        pending = await redis.xpending(stream, c.group)
        if pending["pending"] == 3:
            break
        await asyncio.sleep(0.05)
    assert pending["pending"] == 3  # delivered to the consumer, not acknowledged
    await asyncio.sleep(0.3)  # several failed attempts
    assert not task.done()
    assert (await redis.xpending(stream, c.group))["pending"] == 3
    lock.rollback()
    lock.close()
    assert await asyncio.wait_for(task, 30) == 3
    assert len(records(sqlite_db, team)) == 3
    assert (await redis.xpending(stream, c.group))["pending"] == 0


async def test_a_dead_consumers_pending_events_are_claimed(
    redis: aioredis.Redis, sqlite_db: Engine
) -> None:
    stream = "test-usage-" + uuid.uuid4().hex
    team = "t-" + uuid.uuid4().hex[:8]
    await publish(redis, stream, *(event(team=team) for _ in range(4)))
    dead = consumer(redis, sqlite_db, stream, billing_claim_idle_s=0.2)
    await dead.ensure_group()
    # it reads, then dies before writing: the entries stay pending under its name
    await redis.xreadgroup(dead.group, dead.name, {stream: ">"}, count=10)
    alive = consumer(redis, sqlite_db, stream, billing_claim_idle_s=0.2)
    assert await alive.step() == 0  # not idle long enough yet: nothing to claim or read
    await asyncio.sleep(0.3)
    assert await alive.step() == 4
    assert len(records(sqlite_db, team)) == 4
    assert (await redis.xpending(stream, alive.group))["pending"] == 0


async def test_trim_keeps_everything_not_yet_acknowledged(
    redis: aioredis.Redis, sqlite_db: Engine
) -> None:
    stream = "test-usage-" + uuid.uuid4().hex
    team = "t-" + uuid.uuid4().hex[:8]
    # a second group (another deployment's billing, say) that has read nothing yet
    await redis.xgroup_create(stream, "other", id="0", mkstream=True)
    await publish(redis, stream, *(event(team=team) for _ in range(150)))
    c = consumer(redis, sqlite_db, stream, billing_batch_size=100)
    await c.ensure_group()
    await c.step()
    await c.step()
    assert await redis.xlen(stream) == 150  # "other" acknowledged nothing
    await redis.xgroup_destroy(stream, "other")
    assert (await redis.xpending(stream, c.group))["pending"] == 0
    await publish(redis, stream, *(event(team=team) for _ in range(150)))
    # one consumer holds the first new entry unacknowledged; the rest get written
    [[_, [(oldest, _)]]] = await redis.xreadgroup(c.group, "slow", {stream: ">"}, count=1)
    c._trimmed_at = 0.0
    while await c.step():
        c._trimmed_at = 0.0
    left = await redis.xrange(stream, count=1)
    assert left and left[0][0] <= oldest  # the unacknowledged entry is still there
    assert await redis.xlen(stream) < 300  # and acknowledged ones below it are gone
    assert len(records(sqlite_db, team)) == 299


async def test_an_event_sql_refuses_never_stalls_the_others(
    redis: aioredis.Redis, database: Engine
) -> None:
    """A row the database refuses for what it holds (NUL bytes and a 6,000-character key, which
    PostgreSQL refuses; an integer beyond 64 bits, which SQLite refuses) is set aside in the
    dead-letter stream with its reason, and every other event of the batch is recorded."""
    stream = "test-usage-" + uuid.uuid4().hex
    team = "t-" + uuid.uuid4().hex[:8]
    good = [event(team=team) for _ in range(4)]
    poison = event(team=team, model="m\x00", request_id="r" * 6000, prompt_tokens=2**63)
    await publish(redis, stream, good[0], good[1], poison, good[2])
    await redis.xadd(stream, {"event": b"{not json"})
    await publish(redis, stream, good[3])
    dead_before = await redis.xlen(DEAD_STREAM)
    c = consumer(redis, database, stream)
    await c.ensure_group()
    assert await asyncio.wait_for(c.step(), 30) == 6
    assert sorted(r.request_id for r in records(database, team)) == sorted(
        e["request_id"] for e in good
    )
    assert (await redis.xpending(stream, c.group))["pending"] == 0
    dead = (await redis.xrange(DEAD_STREAM))[dead_before:]
    reasons = sorted(fields[b"reason"].decode().split(":")[0] for _, fields in dead)
    assert reasons == ["malformed", "refused by SQL"]
    kept = [fields[b"event"] for _, fields in dead if fields[b"reason"].startswith(b"refused")]
    assert msgspec.json.decode(kept[0])["team"] == team  # the event itself is kept, not lost
