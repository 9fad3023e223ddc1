"""Stopping the background loops every long-running part keeps (usage consumer, lease keeper,
spool replay, audit writer, upstream health polls, embedding batcher)."""

import asyncio
import contextlib
from typing import Any

# how long a loop may run on after a cancellation before it is cancelled again
RECANCEL_S = 0.5


async def cancel_and_wait(task: "asyncio.Task[Any] | None") -> None:
    """Cancel a background loop and wait until it has ended; an error it ended with is raised.

    The cancellation is repeated while the loop runs on. One cancellation is not always enough: a
    library call may absorb it (the usage consumer was seen sleeping on in a "cancelling" state
    after a Redis call in its loop returned normally), and a loop that survives errors by design
    then goes on for good, so the gateway's shutdown waited out its 30 s bound. Only for loops
    whose work may stop at any await: never for a request's task, whose cleanup must finish."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        await task
