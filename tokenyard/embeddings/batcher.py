"""Dynamic batching: requests that arrive together share forward passes.

One worker takes every request queued (up to `max_batch` inputs, waiting at most `max_wait_s` after
the first for more), runs them in the encoder thread (the event loop stays free to take requests
meanwhile) and hands each its rows. Inputs are sorted by length and run `max_batch` at a time, so
padding stays small and one request of 2,048 inputs is many passes, not one huge one. Each request
is charged its share of the batch's compute time by tokens: the `timings.compute` billing prices a
self-hosted model by.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tokenyard.core.tasks import cancel_and_wait
from tokenyard.embeddings.model import Encoded


@dataclass
class Result:
    encoded: Encoded
    queue_s: float  # from arrival to the start of its batch
    compute_s: float  # its share of the batch's forward passes


@dataclass
class _Job:
    inputs: list[list[int]]
    arrived: float
    future: "asyncio.Future[Result]" = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Batcher:
    def __init__(
        self, encode: Callable[[list[list[int]]], Encoded], max_batch: int, max_wait_s: float
    ) -> None:
        self._encode = encode
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.waiting = 0  # requests queued, not yet in a batch (the /load figure)
        self.batches = 0  # forward passes run (for tests and metrics)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def embed(self, inputs: list[list[int]]) -> Result:
        job = _Job(inputs, time.perf_counter())
        self.waiting += 1
        self._queue.put_nowait(job)
        return await job.future

    async def _collect(self) -> list[_Job]:
        jobs = [await self._queue.get()]
        size = len(jobs[0].inputs)
        deadline = time.perf_counter() + self.max_wait_s
        while size < self.max_batch:
            try:
                if self._queue.empty():
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                else:
                    job = self._queue.get_nowait()
            except TimeoutError:
                break
            jobs.append(job)
            size += len(job.inputs)
        self.waiting -= len(jobs)
        return [j for j in jobs if not j.future.done()]  # a client gone is not computed for

    async def _run(self) -> None:
        while True:
            jobs = await self._collect()
            if not jobs:
                continue
            started = time.perf_counter()
            inputs = [ids for job in jobs for ids in job.inputs]
            try:
                encoded = await asyncio.to_thread(self._encode_all, inputs)
            except Exception as exc:  # the requests fail, the server goes on
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            elapsed = time.perf_counter() - started
            total = max(sum(encoded.tokens), 1)
            start = 0
            for job in jobs:
                end = start + len(job.inputs)
                part = Encoded(encoded.vectors[start:end], encoded.tokens[start:end])
                share = elapsed * max(sum(part.tokens), 1) / total
                if not job.future.done():
                    job.future.set_result(Result(part, started - job.arrived, share))
                start = end

    def _encode_all(self, inputs: list[list[int]]) -> Encoded:
        """In the encoder thread: by length, `max_batch` at a time, rows put back in order."""
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
        vectors: np.ndarray | None = None
        tokens = [0] * len(inputs)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start : start + self.max_batch]
            got = self._encode([inputs[i] for i in chunk])
            self.batches += 1
            if vectors is None:
                vectors = np.empty((len(inputs), got.vectors.shape[1]), dtype=np.float32)
            vectors[chunk] = got.vectors
            for i, n in zip(chunk, got.tokens, strict=True):
                tokens[i] = n
        assert vectors is not None
        return Encoded(vectors, tokens)
