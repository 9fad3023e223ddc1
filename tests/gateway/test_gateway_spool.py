"""The usage spool: events that could not reach Redis are kept in a file and moved into the stream
later; a live gateway's own spool is left to it, a dead one's is taken over."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenyard.gateway.spool import UsageSpool


async def test_spooled_events_reach_the_stream_once(redis_server: Any, tmp_path: Path) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    stream = "test-spool-" + os.urandom(4).hex()
    spool = UsageSpool(tmp_path, stream)
    for i in range(3):
        spool.add(b'{"request_id": "mine-%d"}' % i)
    # a gateway that died with two events spooled, and a live one (our parent) with one
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead_pid = int(dead.stdout)
    (tmp_path / f"usage-spool-{dead_pid}.jsonl").write_bytes(b'{"a": 1}\n{"a": 2}\n')
    live = tmp_path / f"usage-spool-{os.getppid()}.jsonl"
    live.write_bytes(b'{"live": 1}\n')

    assert await spool.replay(redis) == 5
    events = [fields[b"event"] for _, fields in await redis.xrange(stream)]
    mine = [b'{"request_id": "mine-%d"}' % i for i in range(3)]
    assert sorted(events) == sorted([*mine, b'{"a": 1}', b'{"a": 2}'])
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name]  # the live one's, untouched
    assert await spool.replay(redis) == 0  # nothing twice
    await redis.aclose()


async def test_a_failed_replay_keeps_the_events(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, "s")
    spool.add(b'{"x": 1}')
    gone = aioredis.Redis(host="127.0.0.1", port=1)  # nothing listens there
    with pytest.raises(RedisError):
        await spool.replay(gone)
    assert spool.path.read_bytes() == b'{"x": 1}\n'
    await gone.aclose()
