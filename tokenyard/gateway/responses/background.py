"""The Responses API's background mode (`background: true`): the response is stored as `queued`
and returned at once; a task of the gateway that took it walks it like any request (quotas,
routing, fallbacks, billing) and stores the result, which the client polls with GET
/v1/responses/{id} and may cancel with POST /v1/responses/{id}/cancel. Created with
`stream: true`, its events are kept in Redis as the walk makes them (gateway/responses/event_log.py)
and streamed to the client from there: the walk goes on if the client hangs up, and the client
can pick the stream up again, on any gateway, with GET /v1/responses/{id}?stream=true.

Any gateway may be asked: the task's gateway keeps a heartbeat key in Redis while it runs, and a
cancel is a key that task watches. A response whose heartbeat lapsed without a result (its
gateway stopped) reads as `failed`, never as in progress forever.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis.asyncio as aioredis
from litestar.response import Stream
from redis.exceptions import RedisError

from tokenyard.core.errors import GatewayError
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.responses.event_log import EventLog
from tokenyard.gateway.responses.events import EventWriter, Keep, chat_events, native_events
from tokenyard.gateway.responses.store import ResponseStore, Stored
from tokenyard.gateway.responses.translate import Turn, adopt, from_chat, response_object
from tokenyard.gateway.validation import parse
from tokenyard.tenancy import events
from tokenyard.tenancy.policy import TeamPolicy

log = logging.getLogger("tokenyard.gateway")

UNFINISHED = ("queued", "in_progress")
BEAT_S = 2.0  # how often a running response's gateway says it is alive (and looks for a cancel)
LAPSE_S = 15  # ... and how long without that before the response reads as failed
CANCEL_KEEP_S = 3600


def _alive(team: str, response_id: str) -> str:
    return f"ty:{{{team}}}:response:{response_id}:alive"


def _cancel(team: str, response_id: str) -> str:
    return f"ty:{{{team}}}:response:{response_id}:cancel"


def _error_of(body: bytes) -> dict[str, Any]:
    """An upstream's or the gateway's refusal (OpenAI's error body) as a Response's `error`."""
    with contextlib.suppress(msgspec.DecodeError):
        error = msgspec.json.decode(body).get("error")
        if isinstance(error, dict):
            return {"code": error.get("code") or "server_error", "message": error.get("message")}
    return {"code": "server_error", "message": "the model's server failed"}


@dataclass
class _Job:
    """One background response's walk."""

    policy: TeamPolicy
    turn: Turn
    tier: str
    request_id: str
    keep: Keep
    writer: EventWriter | None  # streamed: every event it makes goes to the event log
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def team(self) -> str:
        return self.policy.team


class Background:
    def __init__(self, proxy: Proxy, store: ResponseStore, redis: aioredis.Redis) -> None:
        self.proxy = proxy
        self.store = store
        self.redis = redis
        self.log = EventLog(redis)

    async def start(
        self,
        policy: TeamPolicy,
        turn: Turn,
        tier: str,
        request_id: str,
        keep: Keep,
        stream: bool = False,
    ) -> dict[str, Any]:
        """Store the response as queued, start its walk, and return it as stored; a 503 where
        Redis, which says the walk is alive (and keeps a streamed one's events), cannot be
        reached. `stream`: its events are kept, from `response.created` on."""
        queued = response_object(turn, "queued")
        job = _Job(policy, turn, tier, request_id, keep, EventWriter(turn) if stream else None)
        try:
            await self.redis.set(_alive(policy.team, turn.id), 1, ex=LAPSE_S)
            if job.writer is not None:
                await self.log.append(policy.team, turn.id, job.writer.queued())
        except RedisError:
            raise GatewayError(
                503,
                "background responses need the platform's Redis, which is unavailable; retry "
                "shortly",
                code="service_unavailable",
                retry_after=1,
            ) from None
        await self.store.save(policy.team, queued, turn.context)
        self.proxy.spawn(self._run(job))
        return queued

    def follow(self, team: str, response_id: str, after: int | None) -> AsyncIterator[bytes]:
        """A streamed background response's events after sequence number `after`, as its walk
        makes them, until it ends."""

        async def alive() -> bool:
            return bool(await self.redis.exists(_alive(team, response_id)))

        return self.log.follow(team, response_id, after, alive)

    async def _run(self, job: _Job) -> None:
        team, turn = job.team, job.turn
        beat = asyncio.ensure_future(self._beat(team, turn.id, job.cancelled))
        final: dict[str, Any] | None = None
        try:
            await self.store.save(team, response_object(turn, "in_progress"), turn.context)
            if job.writer is None:
                final = await self._finish(job, await self._walk(job))
            else:
                final = await self._walk_streamed(job, job.writer)
        except Exception:
            log.exception("background response %s failed", turn.id)
            failed = {"code": "server_error", "message": "the gateway failed to finish it"}
            final = response_object(turn, "failed", error=failed)
            with contextlib.suppress(Exception):
                await self.store.save(team, final, turn.context)
        finally:
            beat.cancel()
            with contextlib.suppress(RedisError):
                if job.writer is not None:
                    await self.log.end(team, turn.id)
                await self.redis.delete(_alive(team, turn.id))
        if final is None:  # deleted while it ran
            return
        try:  # OpenAI's response.* webhook event, where the team has a receiver
            kind = f"response.{final['status']}"
            await asyncio.to_thread(events.record, self.store.sql, team, kind, turn.id)
        except Exception:  # the response itself is stored: only its event is lost
            log.exception("could not record the end of background response %s", turn.id)

    async def _finish(self, job: _Job, final: dict[str, Any]) -> dict[str, Any] | None:
        """Store the walk's end (kept with its conversation where it completed); None where the
        response was deleted while it ran."""
        team, turn = job.team, job.turn
        if job.cancelled.is_set() or await self.redis.exists(_cancel(team, turn.id)):
            final["status"] = "cancelled"
        if await self.store.get(team, turn.id) is None:
            return None
        if final["status"] in ("completed", "incomplete"):
            await job.keep(turn, final)
        else:
            await self.store.save(team, final, turn.context)
        return final

    async def _walk(self, job: _Job) -> dict[str, Any]:
        """The finished Response: the model's, or `failed` with the refusal, or `cancelled`."""
        turn = job.turn
        try:
            status, body, served = await self.proxy.run_detached(
                job.policy,
                "chat",
                msgspec.json.encode(turn.chat),
                job.request_id,
                job.cancelled.wait,
                tier=job.tier,
                responses=turn.native,
            )
        except GatewayError as exc:
            if exc.code == "client_closed":  # the cancel, noticed during the upstream call
                return response_object(turn, "cancelled")
            error = {"code": exc.code or "server_error", "message": exc.message}
            return response_object(turn, "failed", error=error)
        if status != 200:
            return response_object(turn, "failed", error=_error_of(body))
        turn.model = served
        data = msgspec.json.decode(body)
        return adopt(turn, data) if self._native(served) else from_chat(turn, data)

    def _native(self, served: str) -> bool:
        """Whether the model that served answered in the Responses API's own form (OpenAI's)."""
        entry = self.proxy.router.catalog.get(served)
        return entry is not None and entry.provider == "openai"

    async def _walk_streamed(self, job: _Job, writer: EventWriter) -> dict[str, Any] | None:
        """Walk a streamed request, every event into the log as it is made. A cancel stops it
        wherever it is: the upstream call is dropped and the team billed what it used."""
        team, turn, ended = job.team, job.turn, []

        async def finish(turn: Turn, response: dict[str, Any]) -> None:
            # stored before the last event goes out, as for a client that waits on the stream
            ended.append(await self._finish(job, response))

        async def walk() -> None:
            await self.log.append(team, turn.id, writer.resumed())
            parsed = parse(msgspec.json.encode(turn.chat), "chat")
            try:
                reply = await self.proxy.open_detached(
                    job.policy,
                    "chat",
                    parsed,
                    job.request_id,
                    job.cancelled.wait,
                    job.tier,
                    turn.native,
                )
            except GatewayError as exc:
                if exc.code != "client_closed":
                    failed = writer.failed(exc.message, exc.code or "", refused=True)
                    await self.log.append(team, turn.id, failed)
                return
            if not isinstance(reply, Stream):  # refused: OpenAI's error body
                error = _error_of(reply.content)
                failed = writer.failed(error["message"], error["code"], refused=True)
                await self.log.append(team, turn.id, failed)
                return
            turn.model = reply.headers.get("x-tokenyard-model") or turn.model
            relay = native_events if self._native(turn.model) else chat_events
            # closed however the loop ends (a cancel, Redis failing), so the upstream stream closes
            # and settles now, not whenever the generator is collected
            async with contextlib.aclosing(relay(writer, reply, finish, queued=True)) as events:
                async for out in events:
                    await self.log.append(team, turn.id, out)

        walking = asyncio.ensure_future(walk())
        stop = asyncio.ensure_future(job.cancelled.wait())
        try:
            await asyncio.wait((walking, stop), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not walking.done():  # cancelled: the stream is closed, and settles
                walking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await walking
        if not walking.cancelled():
            walking.result()  # the walk's own failure, if it had one
        if ended:
            return ended[0]
        if job.cancelled.is_set():
            final = response_object(turn, "cancelled")
        else:  # the stream failed: its error event is in the log
            final = response_object(turn, "failed", error=writer.error)
        return await self._finish(job, final)

    async def _beat(self, team: str, response_id: str, cancelled: asyncio.Event) -> None:
        """Say the response is alive while it runs, and notice a cancel from any gateway."""
        while True:
            with contextlib.suppress(RedisError):
                await self.redis.set(_alive(team, response_id), 1, ex=LAPSE_S)
                if await self.redis.exists(_cancel(team, response_id)):
                    cancelled.set()
            await asyncio.sleep(BEAT_S)

    async def current(self, team: str, found: Stored) -> dict[str, Any]:
        """A stored response as it stands: one left unfinished by a gateway that stopped reads
        (and is stored) as failed."""
        response = found.response
        if response.get("status") not in UNFINISHED:
            return response
        if await self.redis.exists(_alive(team, response["id"])):
            return response
        response["status"] = "failed"
        response["error"] = {"code": "server_error", "message": "the gateway running it stopped"}
        await self.store.save(team, response, found.context)
        return response

    async def cancel(self, team: str, found: Stored) -> dict[str, Any]:
        """Cancel a background response: unfinished, it is stored as cancelled at once and its
        walk stops (the upstream call dropped, the team billed what the upstream used);
        finished, it is returned as it is."""
        response = found.response
        if not response.get("background"):
            raise GatewayError(
                400,
                "only a response created with background=true can be cancelled",
                param="response_id",
            )
        if response.get("status") not in UNFINISHED:
            return response
        await self.stop(team, response["id"])
        response["status"] = "cancelled"
        await self.store.save(team, response, found.context)
        return response

    async def stop(self, team: str, response_id: str) -> None:
        """Tell the response's walk, on whichever gateway runs it, to stop."""
        await self.redis.set(_cancel(team, response_id), 1, ex=CANCEL_KEEP_S)
