"""A local spool for usage events that could not reach Redis: no record lost when Redis is down.

A request settles into the Redis usage stream. When that fails (Redis gone mid-request) or cannot
be tried (served fail-open without Redis), the event is appended to a file of this process under
the data dir; a task moves the spooled events into the stream once Redis answers again. A process
that dies with a non-empty spool leaves the file behind, and the next gateway on that data dir
replays it too (the billing consumer is idempotent by request id, so a replay that was cut short
and is repeated records nothing twice).
"""

import asyncio
import contextlib
import logging
import os
from pathlib import Path

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenyard.core.tasks import cancel_and_wait

log = logging.getLogger("tokenyard.gateway")

_BATCH = 500  # events per XADD pipeline while replaying


def _replayable(path: Path) -> bool:
    """This process's spool, or one left by a process that is gone: a live gateway's own file is
    its to replay (it may be appending to it right now)."""
    pid = int(path.stem.rsplit("-", 1)[1])
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


class UsageSpool:
    def __init__(self, directory: Path | str, stream: str, every_s: float = 1.0) -> None:
        self.directory = Path(directory)
        self.stream = stream
        self.every_s = every_s
        self.path = self.directory / f"usage-spool-{os.getpid()}.jsonl"
        self._task: asyncio.Task[None] | None = None

    def add(self, event: bytes) -> None:
        """Append one event (a JSON line). Synchronous: a small append, on the rare failure path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as spool:
            spool.write(event + b"\n")
        log.warning("usage event spooled to %s until Redis is back", self.path)

    async def replay(self, redis: aioredis.Redis) -> int:
        """Move every spooled event into the stream; returns how many. A file is removed only
        after all of its events were added, so a failure leaves it for the next try."""
        moved = 0
        for path in sorted(self.directory.glob("usage-spool-*.jsonl")):
            if not _replayable(path):
                continue
            claimed = path.with_suffix(f".replaying-{os.getpid()}")
            try:
                path.rename(claimed)  # one process takes a dead one's file (gateways share the dir)
            except FileNotFoundError:
                continue
            lines = [line for line in claimed.read_bytes().splitlines() if line]
            try:
                for start in range(0, len(lines), _BATCH):
                    async with redis.pipeline(transaction=False) as pipe:
                        for line in lines[start : start + _BATCH]:
                            pipe.xadd(self.stream, {"event": line})
                        await pipe.execute()
            except RedisError:
                claimed.rename(path)  # back for the next try
                raise
            claimed.unlink()
            moved += len(lines)
        return moved

    def start(self, redis: aioredis.Redis) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(redis))

    async def _run(self, redis: aioredis.Redis) -> None:
        while True:
            with contextlib.suppress(RedisError):
                if moved := await self.replay(redis):
                    log.warning("replayed %d spooled usage events into %s", moved, self.stream)
            await asyncio.sleep(self.every_s)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
