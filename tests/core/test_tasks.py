"""Background loops stop when asked, even where a call inside them absorbs the cancellation (the
usage consumer did, and the gateway's shutdown waited out its 30 s bound)."""

import asyncio

import pytest

from tokenyard.core.tasks import RECANCEL_S, cancel_and_wait


async def test_a_loop_that_absorbs_a_cancellation_is_stopped_anyway() -> None:
    absorbed = 0

    async def loop() -> None:
        nonlocal absorbed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:  # as a library call can: the loop goes on
                absorbed += 1
                if absorbed > 2:
                    raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.02)
    # one cancellation alone leaves it running
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.2)
    assert not done and absorbed == 1
    async with asyncio.timeout(5 * RECANCEL_S):
        await cancel_and_wait(task)
    assert task.done() and absorbed == 3


async def test_an_error_the_loop_ended_with_is_raised_and_none_is_nothing() -> None:
    async def failing() -> None:
        raise RuntimeError("broken")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="broken"):
        await cancel_and_wait(task)
    await cancel_and_wait(None)
