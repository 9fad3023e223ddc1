"""The batch worker, one per gateway process: claims pending requests from SQL and runs them through
the gateway's own request path (routing, quotas of the batch tier, billing), as many at once as the
engines have spare room; expires, cancels and finalizes jobs; delivers callbacks.

Nothing lives only in memory: a request is leased in SQL while it runs, so when a gateway dies its
unfinished requests are claimed again once their lease runs out, and finished ones are never re-run.
"""

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass

import anyio
import msgspec
from redis.exceptions import RedisError
from sqlalchemy import Engine

from tokenyard.batch import jobs, lifecycle
from tokenyard.batch.files import ENDPOINTS
from tokenyard.batch.models import BatchJob
from tokenyard.core.destinations import allow_list
from tokenyard.core.errors import GatewayError
from tokenyard.core.settings import Settings
from tokenyard.core.tasks import cancel_and_wait
from tokenyard.core.webhooks import deliver, webhook_client
from tokenyard.gateway.chats.store import ChatStore, stored_ask
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.request_ids import new_request_id
from tokenyard.tenancy.keys import policy_by_prefix
from tokenyard.tenancy.policy import TeamPolicy
from tokenyard.tenancy.webhook_secrets import team_secret

log = logging.getLogger("tokenyard.batch")

# new requests started per poll, at most: the engines' load is polled about once a second, so a
# gentle ramp lets their queue depth show before batch overfills them
_RAMP = 8
_POLICY_TTL_S = 5.0  # limit changes reach running batch jobs this fast


@dataclass
class _Running:
    batch_id: str
    task: "asyncio.Task[None]"
    # set when the worker yields the request to interactive traffic: it hangs up as a client
    # would. The gateway drops the upstream call only while it still waits on the upstream; a
    # reply already in hand is recorded (giving it back would send it upstream twice)
    hung_up: asyncio.Event

    @property
    def yielding(self) -> bool:
        return self.hung_up.is_set()


class BatchWorker:
    def __init__(self, proxy: Proxy, sql: Engine, settings: Settings, chats: ChatStore) -> None:
        self.proxy = proxy
        self.sql = sql
        self.chats = chats  # where a request with `store: true` keeps its completion
        self.settings = settings
        self.owner = os.urandom(8).hex()  # this process, as lease holder
        self.running: dict[str, _Running] = {}  # by request id
        self.stopping: dict[str, tuple[str, str]] = {}  # batch id → error its requests end with
        self._interactive_seen = -float("inf")  # monotonic time interactive was last in flight
        self._policies: dict[tuple[str, str], tuple[float, TeamPolicy | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._client = webhook_client()
        self.callback_allow = allow_list(settings.batch_callback_allow)
        self.seconds_per_request = 1.0  # moving average, for estimated completion times

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # leases renew on a clock of their own: a slow tick (SQL contention, a slow callback) must
        # not let them lapse, or another gateway claims a running request and sends it again
        self._loops = [loop.create_task(self._run()), loop.create_task(self._renew())]

    async def stop(self) -> None:
        """Stop claiming, and give the requests still running back for another process to run."""
        for background in self._loops:
            await cancel_and_wait(background)
        for request_id, running in list(self.running.items()):
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running.task
            await self._sql(lifecycle.release, self.sql, self.owner, request_id, 0.0)
        await self._client.aclose()

    async def _sql(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("batch worker tick failed")
            await asyncio.sleep(self.settings.batch_poll_s)

    async def tick(self) -> None:
        await self._stop_jobs()
        for batch_id in await self._sql(lifecycle.finishable_jobs, self.sql):
            job = await self._sql(lifecycle.finalize, self.sql, batch_id)
            if job is not None:
                log.info("batch %s %s", job.id, job.status)
        limit = self.limit(await self._interactive_active())
        active = [r for r in self.running.values() if not (r.yielding or r.task.cancelling())]
        for running in active[limit:]:  # the newest: the least work lost
            running.hung_up.set()
        room = self.room(limit)
        if room:
            claimed = await self._sql(
                lifecycle.claim, self.sql, self.owner, self.settings.batch_lease_s, room
            )
            for request in claimed:
                hung_up = asyncio.Event()
                task = asyncio.get_running_loop().create_task(self._execute(request, hung_up))
                self.running[request.id] = _Running(request.batch_id, task, hung_up)
                task.add_done_callback(lambda _, rid=request.id: self.running.pop(rid, None))
        await self._callbacks()

    async def _renew(self) -> None:
        lease_s = self.settings.batch_lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                await self._sql(lifecycle.renew, self.sql, self.owner, list(self.running), lease_s)
            except Exception:
                log.exception("renewing batch leases failed")

    def limit(self, interactive: bool) -> int:
        """Batch requests this process may run: few while interactive traffic is about, whose
        time to first token batch decodes would stretch (they share the engine's steps)."""
        settings = self.settings
        if interactive:  # never more than without interactive traffic
            return min(settings.batch_shared_concurrency, settings.batch_max_concurrency)
        return settings.batch_max_concurrency

    async def _interactive_active(self) -> bool:
        """Interactive requests in flight anywhere on the platform (the quota leases say so), now
        or within the last batch_interactive_hold_s."""
        try:
            interactive = await self.proxy.quotas.interactive_in_flight()
        except RedisError:
            return True  # unknown: the side that keeps interactive traffic fast
        if interactive:
            self._interactive_seen = time.monotonic()
        return time.monotonic() - self._interactive_seen < self.settings.batch_interactive_hold_s

    def room(self, limit: int) -> int:
        """How many more requests to start now: none while a self-hosted engine has a queue or a
        nearly full KV cache (interactive requests would wait behind batch work)."""
        for upstream in self.proxy.backends.upstreams.values():
            info = upstream.info
            if info.provider != "self-hosted" or not info.ready:
                continue
            if info.waiting > 0 or info.kv_usage >= self.settings.batch_max_kv_usage:
                return 0
        return max(0, min(_RAMP, limit - len(self.running)))

    async def _stop_jobs(self) -> None:
        """Cancelled and expired jobs: their requests running here are stopped, the others end
        with the job's error, so the job can be finalized with what was done."""
        self.stopping = await self._sql(lifecycle.stopping_jobs, self.sql)
        for batch_id, error in self.stopping.items():
            for running in list(self.running.values()):
                if running.batch_id == batch_id and not running.task.cancelling():
                    running.task.cancel()
            await self._sql(lifecycle.abandon, self.sql, batch_id, error)

    async def _policy(self, team: str, key_prefix: str) -> TeamPolicy | None:
        """The job's team's policy, narrowed to the models of the key that created the job."""
        now = time.monotonic()
        hit = self._policies.get((team, key_prefix))
        if hit is None or hit[0] < now:
            policy = await self._sql(policy_by_prefix, self.sql, team, key_prefix)
            hit = self._policies[team, key_prefix] = (now + _POLICY_TTL_S, policy)
        return hit[1]

    async def _execute(self, request: lifecycle.Claimed, hung_up: asyncio.Event) -> None:
        started = time.monotonic()
        upstream_id = new_request_id()  # per attempt: billing keeps one per id
        retry_in = 1  # a refusal for load or quota: run it again after this (seconds)
        try:
            policy = await self._policy(request.team, request.key_prefix)
            if policy is None:
                raise GatewayError(401, f"team {request.team!r} no longer exists", "invalid_team")
            status, body, served = await self.proxy.run_detached(
                policy,
                ENDPOINTS[request.endpoint],
                request.body,
                upstream_id,
                hung_up.wait,
            )
            stored = stored_ask(request.body) if status == 200 else None
            if stored is not None and ENDPOINTS[request.endpoint] == "chat":
                completion = msgspec.json.decode(body)
                await self.chats.save(request.team, stored, completion, served, upstream_id)
        except GatewayError as exc:
            if exc.code == "client_closed" and hung_up.is_set():
                # yielded to interactive traffic before the upstream replied: runs again later
                await self._sql(lifecycle.release, self.sql, self.owner, request.id, 0.0)
                return
            status, body, retry_in = exc.status, exc.body(), exc.retry_after or retry_in
        except asyncio.CancelledError:
            error = self.stopping.get(request.batch_id)
            if error is not None:  # the job was cancelled or expired
                await self._sql(lifecycle.finish, self.sql, self.owner, request.id, error=error)
            raise  # (else: shutting down, stop() gives it back)
        except Exception:
            log.exception("batch request %s failed", request.id)
            status, body = 500, GatewayError(500, "internal error", "internal_error").body()
        if status in (429, 503):  # a quota or a saturated engine: not failed, run again later
            not_before = time.time() + retry_in
            await self._sql(lifecycle.release, self.sql, self.owner, request.id, not_before)
            return
        self.seconds_per_request += 0.1 * (time.monotonic() - started - self.seconds_per_request)
        await self._sql(
            lifecycle.finish,
            self.sql,
            self.owner,
            request.id,
            status_code=status,
            upstream_request_id=upstream_id,
            response=body,
        )

    async def _callbacks(self) -> None:
        job = await self._sql(lifecycle.claim_callback, self.sql, self.settings.batch_lease_s)
        if job is None or not job.callback_url:
            return
        task = asyncio.get_running_loop().create_task(self._callback(job))
        self._tasks.add(task)  # referenced until done
        task.add_done_callback(self._tasks.discard)

    async def _callback(self, job: BatchJob) -> None:
        assert job.callback_url
        secret = await self._sql(team_secret, self.sql, job.team)
        ok = secret is not None and await deliver(
            self._client,
            job.callback_url,
            message_id=job.id,  # a job has one callback: its id names the delivery
            body=msgspec.json.encode(jobs.batch_object(job)),
            secret=secret,
            allow=self.callback_allow,
            attempts=self.settings.batch_callback_attempts,
            backoff_s=self.settings.batch_callback_backoff_s,
        )
        await self._sql(lifecycle.callback_done, self.sql, job.id, ok)
