"""The usage consumer: moves usage events from the Redis stream into SQL, without loss.

Every gateway process runs one, all in one consumer group per deployment, so each event goes to
one of them. An event is acknowledged only after the transaction holding its record committed;
until then it stays pending in Redis. While SQL is down the consumer retries the same batch with
backoff. Entries left pending by a consumer that died (or is stuck) are claimed by another after
`billing_claim_idle_s`. Writes are idempotent by request id, so an event delivered twice (claimed
while its first consumer was still retrying, say) is recorded once. The stream is trimmed only
below what every group has acknowledged. An event SQL can never take (it refuses the row while it
answers other writes) or that cannot be decoded is moved to the dead-letter stream `DEAD_STREAM`
with the reason, so that it neither blocks the events behind it nor is lost.
"""

import asyncio
import logging
import math
import os
import socket
import time

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from tokenyard.billing import store
from tokenyard.billing.events import alert_rows, decoder, to_row
from tokenyard.core.settings import Settings
from tokenyard.core.tasks import cancel_and_wait
from tokenyard.core.usage import USAGE_STREAM

log = logging.getLogger("tokenyard.billing")

Entry = tuple[bytes, dict[bytes, bytes] | None]
DEAD_STREAM = "ty:usage-dead"
_MAX_BACKOFF_S = 30.0
_TRIM_EVERY_S = 10.0


def _older(a: bytes, b: bytes) -> bytes:
    """The smaller of two stream ids."""
    ka, kb = (tuple(map(int, x.split(b"-"))) for x in (a, b))
    return a if ka <= kb else b


class UsageConsumer:
    def __init__(
        self,
        redis: aioredis.Redis,
        sql: Engine,
        settings: Settings,
        stream: str = USAGE_STREAM,
    ) -> None:
        self.redis = redis
        self.sql = sql
        self.stream = stream
        self.group = settings.billing_consumer_group
        self.name = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.batch_size = settings.billing_batch_size
        self.block_ms = settings.billing_block_ms
        self.claim_idle_ms = int(settings.billing_claim_idle_s * 1000)
        self.retry_s = settings.billing_retry_s
        self.flush_s = settings.billing_flush_s
        self._task: asyncio.Task[None] | None = None
        self._trimmed_at = 0.0
        self._claimed_at = -math.inf

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop between batches or mid-retry: what is not acknowledged stays pending."""
        await cancel_and_wait(self._task)

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _run(self) -> None:
        backoff = self.retry_s
        while True:
            try:
                await self.ensure_group()
                while True:
                    handled = await self.step()
                    backoff = self.retry_s
                    if handled < self.batch_size:
                        # let events gather: one larger SQL write instead of many small ones,
                        # which under load cost the gateway's event loop a third of its throughput
                        await asyncio.sleep(self.flush_s)
            except RedisError as exc:
                log.warning("usage stream unreachable, retrying in %.1f s: %s", backoff, exc)
            except Exception:  # a bug must not stop recording for good: the events wait in Redis
                log.exception("usage consumer failed, restarting in %.1f s", backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def step(self) -> int:
        """One batch: claim abandoned entries, else read new ones (waiting up to the block time);
        write them and acknowledge. Returns how many entries it handled."""
        entries = await self._claim_due() or await self._read()
        if not entries:
            return 0
        await self._commit(entries)
        await self._trim()
        return len(entries)

    async def _claim_due(self) -> list[Entry]:
        """Abandoned entries, looked for twice per idle time (not on every read)."""
        now = time.monotonic()
        if now - self._claimed_at < self.claim_idle_ms / 2000:
            return []
        self._claimed_at = now
        _, claimed, *_ = await self.redis.xautoclaim(
            self.stream, self.group, self.name, self.claim_idle_ms, "0-0", count=self.batch_size
        )
        return claimed

    async def _read(self) -> list[Entry]:
        got = await self.redis.xreadgroup(
            self.group, self.name, {self.stream: ">"}, count=self.batch_size, block=self.block_ms
        )
        return got[0][1] if got else []

    async def _commit(self, entries: list[Entry]) -> None:
        rows = []
        alerts = []  # the budget alerts that rode with the events
        kept = []  # (entry id, raw event) of each row
        for entry_id, fields in entries:
            if not fields:  # trimmed away while pending: nothing left to record
                continue
            raw = fields.get(b"event", b"")
            try:
                event = decoder.decode(raw)
                crossed = alert_rows(fields.get(b"alerts"), event)
                rows.append(to_row(event))
                alerts += crossed
                kept.append((entry_id, raw))
            except (msgspec.DecodeError, ValueError, OverflowError) as exc:
                await self._dead(entry_id, raw, f"malformed: {exc}")
        backoff = self.retry_s
        while True:
            try:
                refused = await asyncio.to_thread(store.write_or_isolate, self.sql, rows, alerts)
                for i, reason in refused:
                    await self._dead(*kept[i], f"refused by SQL: {reason}")
                break
            except SQLAlchemyError as exc:
                log.warning(
                    "usage store unavailable, retrying %d events in %.1f s: %s",
                    len(rows),
                    backoff,
                    exc.__class__.__name__,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
        await self.redis.xack(self.stream, self.group, *(entry_id for entry_id, _ in entries))

    async def _dead(self, entry_id: bytes, raw: bytes, reason: str) -> None:
        """Set an event aside that can never be recorded: retrying it would stall every event
        behind it. It stays in the dead-letter stream for an operator to inspect."""
        log.error("usage event %s set aside in %s: %s", entry_id.decode(), DEAD_STREAM, reason)
        await self.redis.xadd(DEAD_STREAM, {b"event": raw, b"reason": reason.encode()})

    async def _trim(self) -> None:
        """Drop entries that every group has acknowledged: those below both each group's oldest
        pending entry and its last delivered one."""
        now = time.monotonic()
        if now - self._trimmed_at < _TRIM_EVERY_S:
            return
        self._trimmed_at = now
        floor: bytes | None = None
        for group in await self.redis.xinfo_groups(self.stream):
            limit = group["last-delivered-id"]
            limit = limit if isinstance(limit, bytes) else str(limit).encode()
            if group["pending"]:
                pending = await self.redis.xpending(self.stream, group["name"])
                limit = _older(limit, pending["min"])
            floor = limit if floor is None else _older(floor, limit)
        if floor is not None and floor != b"0-0":
            await self.redis.xtrim(self.stream, minid=floor, approximate=True)
