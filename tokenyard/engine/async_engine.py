"""The async API: generate(request) → async iterator of outputs; the step loop runs in a thread of
its own (torch releases the GIL inside kernels), so the event loops stay responsive. Requests and
cancellations reach the loop through a queue and are applied between steps; outputs come back
through call_soon_threadsafe.

The server runs the step loop on the main thread (`run`) and HTTP in another: PyTorch's OpenMP pool
belongs to the thread that first used it, usually the main one, and a second pool would manage more
threads than there are cores, which makes libgomp stop spinning between kernels (every small op
then pays a futex wake-up, ~50 us: 20-30% of a step on two cores). `start` runs it in a background
thread, for in-process use where that matters less.
"""

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable

from tokenyard.engine.engine import LLMEngine
from tokenyard.engine.outputs import RequestOutput
from tokenyard.engine.sequence import GenerationRequest

log = logging.getLogger(__name__)


class EngineStopped(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self.run, name="engine-loop", daemon=True)

    def start(self) -> None:
        """Run the step loop in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[RequestOutput]:
        """Outputs of every choice until all have finished; closing the iterator cancels."""
        if self._stopping:
            raise EngineStopped("the engine is shutting down")
        self.engine.validate(request)  # raises RequestError before anything is queued
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.request_id] = (asyncio.get_running_loop(), outputs)
        self._send(("add", request))
        pending = request.n
        try:
            while pending:
                out = await outputs.get()
                if out.finish_reason is not None:
                    pending -= 1
                yield out
        finally:
            self._streams.pop(request.request_id, None)
            if pending:
                self._send(("abort", request.request_id))

    def _send(self, message: tuple) -> None:
        self._inbox.put(message)
        self._wake.set()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "abort":
                self.engine.abort(payload)
                continue
            try:
                self.engine.add_request(payload)
            except ValueError as exc:
                log.warning("request %s refused: %s", payload.request_id, exc)
                self._deliver(
                    [
                        RequestOutput(payload.request_id, c, "", finish_reason="error")
                        for c in range(payload.n)
                    ]
                )

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their event loops: one wake-up per loop, not per output,
        so the engine thread's matmuls are disturbed as little as possible."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            target = self._streams.get(out.request_id)
            if target is not None:
                loop, stream = target
                by_loop.setdefault(loop, []).append((stream, out))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """The step loop, in the calling thread, until stop() or until() (checked at least once a
        second while idle)."""
        while not self._stopping and not until():
            self._drain_inbox()
            if not self.engine.has_work():
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # the loop must outlive any one bad step
                log.exception("engine step failed; failing the requests that took part in it")
                outputs = self.engine.fail_step()
            self._deliver(outputs)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for stream, out in items:
        stream.put_nowait(out)
