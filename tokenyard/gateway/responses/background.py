"""The Responses API's background mode (`background: true`): the response is stored as `queued`
and returned at once; a task of the gateway that took it walks it like any request (quotas,
routing, fallbacks, billing) and stores the result, which the client polls with GET
/v1/responses/{id} and may cancel with POST /v1/responses/{id}/cancel.

Any gateway may be asked: the task's gateway keeps a heartbeat key in Redis while it runs, and a
cancel is a key that task watches. A response whose heartbeat lapsed without a result (its
gateway stopped) reads as `failed`, never as in progress forever.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenyard.core.errors import GatewayError
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.responses.store import ResponseStore, Stored
from tokenyard.gateway.responses.translate import Turn, adopt, from_chat, response_object
from tokenyard.tenancy import events
from tokenyard.tenancy.policy import TeamPolicy

log = logging.getLogger("tokenyard.gateway")

UNFINISHED = ("queued", "in_progress")
BEAT_S = 2.0  # how often a running response's gateway says it is alive (and looks for a cancel)
LAPSE_S = 15  # ... and how long without that before the response reads as failed
CANCEL_KEEP_S = 3600

# what a finished response is handed to: stored, and added to its conversation
Keep = Callable[[Turn, dict[str, Any]], Awaitable[None]]


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


class Background:
    def __init__(self, proxy: Proxy, store: ResponseStore, redis: aioredis.Redis) -> None:
        self.proxy = proxy
        self.store = store
        self.redis = redis

    async def start(
        self, policy: TeamPolicy, turn: Turn, tier: str, request_id: str, keep: Keep
    ) -> dict[str, Any]:
        """Store the response as queued, start its walk, and return it as stored; a 503 where
        Redis, which says the walk is alive, cannot be reached."""
        queued = response_object(turn, "queued")
        try:
            await self.redis.set(_alive(policy.team, turn.id), 1, ex=LAPSE_S)
        except RedisError:
            raise GatewayError(
                503,
                "background responses need the platform's Redis, which is unavailable; retry "
                "shortly",
                code="service_unavailable",
                retry_after=1,
            ) from None
        await self.store.save(policy.team, queued, turn.context)
        self.proxy.spawn(self._run(policy, turn, tier, request_id, keep))
        return queued

    async def _run(
        self, policy: TeamPolicy, turn: Turn, tier: str, request_id: str, keep: Keep
    ) -> None:
        team, cancelled = policy.team, asyncio.Event()
        beat = asyncio.ensure_future(self._beat(team, turn.id, cancelled))
        try:
            await self.store.save(team, response_object(turn, "in_progress"), turn.context)
            final = await self._walk(policy, turn, tier, request_id, cancelled.wait)
            if cancelled.is_set() or await self.redis.exists(_cancel(team, turn.id)):
                final["status"] = "cancelled"
            if await self.store.get(team, turn.id) is None:  # deleted while it ran
                return
            if final["status"] in ("completed", "incomplete"):
                await keep(turn, final)  # stored, and added to its conversation
            else:
                await self.store.save(team, final, turn.context)
        except Exception:
            log.exception("background response %s failed", turn.id)
            failed = {"code": "server_error", "message": "the gateway failed to finish it"}
            final = response_object(turn, "failed", error=failed)
            with contextlib.suppress(Exception):
                await self.store.save(team, final, turn.context)
        finally:
            beat.cancel()
            with contextlib.suppress(RedisError):
                await self.redis.delete(_alive(team, turn.id))
        try:  # OpenAI's response.* webhook event, where the team has a receiver
            kind = f"response.{final['status']}"
            await asyncio.to_thread(events.record, self.store.sql, team, kind, turn.id)
        except Exception:  # the response itself is stored: only its event is lost
            log.exception("could not record the end of background response %s", turn.id)

    async def _walk(
        self,
        policy: TeamPolicy,
        turn: Turn,
        tier: str,
        request_id: str,
        hang_up: Callable[[], Awaitable[Any]],
    ) -> dict[str, Any]:
        """The finished Response: the model's, or `failed` with the refusal, or `cancelled`."""
        try:
            status, body, served = await self.proxy.run_detached(
                policy,
                "chat",
                msgspec.json.encode(turn.chat),
                request_id,
                hang_up,
                tier=tier,
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
        entry = self.proxy.router.catalog.get(served)
        data = msgspec.json.decode(body)
        native = entry is not None and entry.provider == "openai"
        return adopt(turn, data) if native else from_chat(turn, data)

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
