"""A streamed background response's events, kept in a Redis stream so that any gateway can relay
them: to the client that created it, and to one that reconnects later (GET
/v1/responses/{id}?stream=true, from just after the `starting_after` sequence number). The walk
appends every event it makes and an end mark when it stops; the events are kept for `KEEP_S`
after the last one. An event's entry id is its sequence number + 1 (`N-0`; Redis ids start above
0-0), so a follower picks up after any event by reading from its id; the end mark takes an id
Redis makes (milliseconds since 1970), which is above every event's.
"""

from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import redis.asyncio as aioredis

KEEP_S = 3600
# a follower's blocking read; under the connection's 1 s socket timeout (core/redis_client.py)
BLOCK_MS = 500


def _key(team: str, response_id: str) -> str:
    return f"ty:{{{team}}}:response:{response_id}:events"


class _Numbered(msgspec.Struct):
    sequence_number: int


def _split(events: bytes) -> list[tuple[int, bytes]]:
    """Server-sent events (`event: …\\ndata: {json}\\n\\n`, as events.sse_event writes them, the
    JSON on one line) one by one, each with its sequence number."""
    out = []
    for block in events.split(b"\n\n"):
        if block:
            data = block.partition(b"\ndata: ")[2]
            out.append((msgspec.json.decode(data, type=_Numbered).sequence_number, block + b"\n\n"))
    return out


class EventLog:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis

    async def append(self, team: str, response_id: str, events: bytes) -> None:
        key = _key(team, response_id)
        pipe = self.redis.pipeline(transaction=False)
        for sequence, event in _split(events):
            pipe.xadd(key, {"event": event}, id=f"{sequence + 1}-0")
        pipe.expire(key, KEEP_S)
        await pipe.execute()

    async def end(self, team: str, response_id: str) -> None:
        key = _key(team, response_id)
        await (
            self.redis.pipeline(transaction=False)
            .xadd(key, {"end": 1})
            .expire(key, KEEP_S)
            .execute()
        )

    async def kept(self, team: str, response_id: str) -> bool:
        return bool(await self.redis.exists(_key(team, response_id)))

    async def delete(self, team: str, response_id: str) -> None:
        await self.redis.delete(_key(team, response_id))

    async def follow(
        self, team: str, response_id: str, after: int | None, alive: Callable[[], Awaitable[bool]]
    ) -> AsyncIterator[bytes]:
        """The events after sequence number `after` (all of them when None), as they come, until
        the end mark; or, where the walk's gateway stopped without one (`alive` says no), until
        nothing more is there."""
        key, gone = _key(team, response_id), False
        last = "0-0" if after is None else f"{after + 1}-0"  # the entry of event `after`
        while True:
            found = await self.redis.xread({key: last}, count=256, block=None if gone else BLOCK_MS)
            if not found:
                if gone:
                    return
                gone = not await alive()  # one more read without waiting, then stop
                continue
            for entry, fields in found[0][1]:
                last = entry
                if b"end" in fields:
                    return
                yield fields[b"event"]
