"""The async API: a failing step fails its requests, not the loop; blocks come back."""

import asyncio
import sys
import threading

import pytest

from tokenyard.engine.async_engine import AsyncEngine
from tokenyard.engine.sequence import GenerationRequest

from .conftest import assert_all_blocks_free, greedy, run_to_completion


def test_a_failing_step_ends_its_requests_with_error_and_the_loop_goes_on(engine_factory):
    core = engine_factory(num_blocks=2048)
    engine = AsyncEngine(core)
    forward = core.runner.model.forward
    calls = {"n": 0}

    def broken_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return forward(*args, **kwargs)

    core.runner.model.forward = broken_once
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
        del core.runner.model.forward  # back to the class's method
    assert calls["n"] > 1
    assert_all_blocks_free(core)


def test_a_failing_step_spares_the_requests_that_were_not_in_it(engine_factory):
    """Only the requests of the failed step end (one of them may be what failed); one that was
    waiting goes on, and its tokens are those it gets alone."""
    core = engine_factory(num_blocks=2048, max_num_seqs=1)  # one request runs, the other waits
    ask = [{"role": "user", "content": "Name a colour."}]
    fails = core.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    waits = core.tokenizer.apply_chat_template(ask)
    alone = run_to_completion(core, [GenerationRequest("alone", waits, greedy(4))])["alone"]
    core.add_request(GenerationRequest("fails", fails, greedy(4)))
    core.add_request(GenerationRequest("waits", waits, greedy(4)))

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    core.runner.model.forward = broken
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            core.step()
    finally:
        del core.runner.model.forward  # back to the class's method
    ended = core.fail_step()
    assert [(o.request_id, o.finish_reason) for o in ended] == [("fails", "error")]
    served = []
    while core.has_work():
        served += core.step()
    assert {o.request_id for o in served} == {"waits"} and served[-1].finish_reason == "length"
    assert [t for o in served for t in o.token_ids] == [t for o in alone for t in o.token_ids]
    assert_all_blocks_free(core)


def test_load_is_read_safely_while_the_engine_thread_queues_requests(engine_factory):
    """The server's thread answers /load while the engine's thread adds and drops requests: it
    reads a snapshot, never the live queues (iterating a tenant dict that grows raised
    'dictionary changed size during iteration', a 500 the gateway took for a sick replica)."""
    core = engine_factory(num_blocks=2048)
    errors: list[BaseException] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                core.load()
            except BaseException as exc:  # what a server thread would have turned into a 500
                errors.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often enough to land inside an iteration
    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for i in range(3000):
            request = GenerationRequest(f"load-{i}", [1, 2, 3], greedy(1), tenant=f"team-{i}")
            core.add_request(request)
            if i % 50 == 49:
                for j in range(i - 49, i + 1):
                    core.abort(f"load-{j}")
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
    assert errors == []
    assert core.load()["waiting"] == 0 and not core.has_work()
    core.add_request(GenerationRequest("load-last", [1, 2, 3], greedy(1), tenant="late"))
    assert core.load()["waiting"] == 1 and core.load()["tokens_queued"] == 3
    core.abort("load-last")
    assert core.load()["waiting"] == 0


def test_load_counts_a_request_running_while_its_first_step_runs(engine_factory, monkeypatch):
    """/load is a snapshot: one taken during a prefill's step shows the request running, with
    its blocks taken, not still waiting."""
    core = engine_factory()
    seen = []
    run = core.runner.run

    def spy(step):
        seen.append(core.load())
        return run(step)

    monkeypatch.setattr(core.runner, "run", spy)
    core.add_request(GenerationRequest("first", list(range(1, 40)), greedy(1)))
    before = core.load()
    assert (before["running"], before["waiting"]) == (0, 1)
    core.step()  # the whole prompt, and its one token
    assert (seen[0]["running"], seen[0]["waiting"]) == (1, 0)
    assert seen[0]["free_blocks"] < before["free_blocks"]
    assert not core.has_work()  # the engine is shared: left as found
    assert core.load() == before | {"waiting": 0, "tokens_queued": 0}
