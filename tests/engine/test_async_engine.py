"""The async API: a failing step fails its requests, not the loop; blocks come back."""

import asyncio

from engine.async_engine import AsyncEngine
from engine.sequence import GenerationRequest

from .conftest import assert_all_blocks_free, greedy


def test_a_failing_step_ends_its_requests_with_error_and_the_loop_goes_on(engine_factory):
    core = engine_factory(num_blocks=2048)
    engine = AsyncEngine(core)
    forward = core.model.forward
    calls = {"n": 0}

    def broken_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return forward(*args, **kwargs)

    core.model.forward = broken_once
    ids = core.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])

    async def run(request_id: str) -> list:
        request = GenerationRequest(request_id, ids, greedy(4, min_tokens=4))
        return [out async for out in engine.generate(request)]

    engine.start()
    try:
        failed = asyncio.run(run("first"))
        assert [o.finish_reason for o in failed] == ["error"]
        served = asyncio.run(run("second"))
        assert [o.finish_reason for o in served][-1] == "length"
        assert sum(len(o.token_ids) for o in served) == 4
    finally:
        engine.stop()
        del core.model.forward  # back to the class's method
    assert calls["n"] > 1
    assert_all_blocks_free(core)
