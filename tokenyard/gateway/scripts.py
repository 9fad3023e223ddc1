"""Lua scripts whose calls from one event-loop turn share a Redis round trip (the quotas')."""

import asyncio
import hashlib
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError


class BatchedScript:
    """A Lua script whose calls from the same event-loop turn share one round trip.

    Under concurrency many requests reserve or settle at once; sending their script calls as one
    pipeline costs one write and one read instead of one each. Each call still runs atomically on
    its own: batching changes only the transport.
    """

    def __init__(self, redis: aioredis.Redis, source: str) -> None:
        self.redis = redis
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._pending: list[tuple[list[Any], list[Any], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((keys, args, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)  # after every request that is ready in this turn
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[list[Any], list[Any], asyncio.Future[Any]]]) -> None:
        try:
            results = await self._send(batch)
            if any(isinstance(r, NoScriptError) for r in results):  # Redis restarted or flushed
                await self.redis.script_load(self.source)
                results = await self._send(batch)
        except Exception as exc:  # every waiter must hear of it, whatever it was
            results = [exc] * len(batch)
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():  # its request was cancelled meanwhile
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _send(self, batch: list[tuple[list[Any], list[Any], asyncio.Future[Any]]]) -> list:
        if len(batch) == 1:  # a pipeline costs more than a plain call for one command
            keys, args, _ = batch[0]
            try:
                return [await self.redis.evalsha(self.sha, len(keys), *keys, *args)]
            except NoScriptError as exc:
                return [exc]
        pipe = self.redis.pipeline(transaction=False)
        for keys, args, _ in batch:
            pipe.evalsha(self.sha, len(keys), *keys, *args)
        return await pipe.execute(raise_on_error=False)
