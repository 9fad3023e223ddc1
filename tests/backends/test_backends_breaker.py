"""The circuit breaker on a real Redis: opening, skipping, one half-open probe across processes
(two Breaker instances on one Redis), closing; and which outcomes count as failures."""

import asyncio
import json

import pytest
from tenacity import Future, RetryCallState

from tests.backends.conftest import control, stats
from tokenyard.backends.base import BackendUnavailable, ModelInfo, UpstreamBroken, UpstreamCall
from tokenyard.backends.breaker import Breaker, BreakerConfig
from tokenyard.backends.metrics import BREAKER_STATE, BREAKER_TRANSITIONS
from tokenyard.backends.retry import Guard, Retryable, RetryPolicy

CONFIG = BreakerConfig(failures=3, error_rate=0.5, min_requests=1000, open_s=0.3, probe_s=5)


async def fail(breaker: Breaker, times: int = 1) -> None:
    for _ in range(times):
        assert await breaker.admit() is False
        await breaker.failure(False)


async def opened(redis, name: str) -> Breaker:
    breaker = Breaker(name, redis, CONFIG)
    await fail(breaker, 3)
    assert breaker.state == "open"
    return breaker


async def test_opens_after_consecutive_failures_and_other_processes_see_it(redis):
    breaker = Breaker("b1", redis, CONFIG)
    await fail(breaker, 2)
    assert breaker.state == "closed"
    await fail(breaker)
    assert breaker.state == "open"
    with pytest.raises(BackendUnavailable) as err:
        await breaker.admit()
    assert err.value.code == "circuit_open" and err.value.status == 503
    other = Breaker("b1", redis, CONFIG)
    assert other.state == "closed"
    await other.refresh()
    assert other.state == "open"
    assert BREAKER_STATE.labels("b1")._value.get() == 2


async def test_a_success_resets_the_consecutive_count(redis):
    breaker = Breaker("b2", redis, CONFIG)
    await fail(breaker, 2)
    await breaker.success(False)  # flushed with the next write
    await fail(breaker, 2)
    assert breaker.state == "closed"
    await fail(breaker)
    assert breaker.state == "open"


async def test_opens_on_the_error_rate_once_the_window_has_enough_requests(redis):
    config = BreakerConfig(failures=100, error_rate=0.5, min_requests=10, open_s=5)
    breaker = Breaker("b3", redis, config)
    for _ in range(4):
        await breaker.success(False)
        await fail(breaker)
    assert breaker.state == "closed"  # 4 of 8: below the minimum of requests
    await breaker.success(False)
    await fail(breaker)
    assert breaker.state == "open"  # 5 of 10


async def test_exactly_one_probe_across_two_processes_then_success_closes(redis):
    a = await opened(redis, "b4")
    b = Breaker("b4", redis, CONFIG)
    await b.refresh()
    assert b.state == "open"
    await asyncio.sleep(0.35)
    await a.refresh()
    await b.refresh()
    assert a.state == b.state == "half_open"
    before = BREAKER_TRANSITIONS.labels("b4", "closed")._value.get()
    results = await asyncio.gather(*(x.admit() for x in (a, b, a, b, a, b)), return_exceptions=True)
    assert results.count(True) == 1
    assert all(isinstance(r, BackendUnavailable) for r in results if r is not True)
    prober, other = (a, b) if results.index(True) % 2 == 0 else (b, a)
    await prober.success(True)
    assert prober.state == "closed"
    await other.refresh()
    assert other.state == "closed"
    assert await other.admit() is False
    assert BREAKER_TRANSITIONS.labels("b4", "closed")._value.get() == before + 2


async def test_a_failed_probe_reopens_for_another_open_time(redis):
    breaker = await opened(redis, "b5")
    await asyncio.sleep(0.35)
    assert breaker.state == "half_open"
    assert await breaker.admit() is True
    await breaker.failure(True)
    assert breaker.state == "open"
    with pytest.raises(BackendUnavailable):
        await breaker.admit()
    await asyncio.sleep(0.35)
    assert await breaker.admit() is True  # the next probe


async def test_a_probe_without_a_verdict_hands_the_lock_back(redis):
    a = await opened(redis, "b6")
    b = Breaker("b6", redis, CONFIG)
    await asyncio.sleep(0.35)
    await b.refresh()
    assert await a.admit() is True
    with pytest.raises(BackendUnavailable):
        await b.admit()
    await a.release(True)
    assert await b.admit() is True


async def test_late_outcomes_while_open_change_nothing(redis):
    breaker = await opened(redis, "b7")
    await breaker.failure(False)  # a request that began before the breaker opened
    await asyncio.sleep(0.35)
    await breaker.refresh()
    assert breaker.state == "half_open"


def chat(text: str, team: str = "", **extra: object) -> UpstreamCall:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], **extra}
    headers = {"x-tenant": team} if team else {}
    return UpstreamCall("/v1/chat/completions", json.dumps(body).encode(), headers)


async def test_backend_failures_open_it_and_4xx_do_not(make_upstream, openai_url):
    upstream = make_upstream(
        "openai",
        [openai_url + "/v1"],
        model_id="brk",
        backend_breaker_failures=2,
        backend_breaker_open_s=0.3,
        backend_retry_attempts=1,
    )
    control(openai_url, reset=True)
    for _ in range(3):
        assert (await upstream.complete(chat("bad #status=400"))).status == 400
    await upstream.refresh()
    assert upstream.info.circuit == "closed" and upstream.info.ready
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            await upstream.complete(chat("down #status=503"))
    assert upstream.info.circuit == "open" and not upstream.info.ready
    seen = stats(openai_url)["requests"]
    with pytest.raises(BackendUnavailable) as err:
        await upstream.complete(chat("skipped"))
    assert err.value.code == "circuit_open"
    assert stats(openai_url)["requests"] == seen  # never sent
    await asyncio.sleep(0.35)
    await upstream.refresh()
    assert upstream.info.circuit == "half_open" and upstream.info.ready
    assert (await upstream.complete(chat("probe"))).status == 200
    assert upstream.info.circuit == "closed"


async def test_a_stream_cut_counts_as_a_failure(make_upstream, openai_url):
    upstream = make_upstream(
        "openai", [openai_url + "/v1"], model_id="brk2", backend_breaker_failures=1
    )
    stream = await upstream.open_stream(chat("cut #cut=2", stream=True))
    with pytest.raises(UpstreamBroken):
        async for _ in stream.chunks():
            pass
    await stream.aclose()
    assert upstream.info.circuit == "open"


async def test_500s_of_one_teams_requests_never_open_it_for_every_team(redis):
    """A backend answering one team's requests with 500s may be failing on what that team sends:
    that alone leaves the shared breaker closed; once a second team's requests fail so too, or
    when the backend itself is unreachable (no team to blame), it opens."""
    breaker = Breaker("b-blame", redis, CONFIG)
    for _ in range(10):
        await breaker.failure(False, team="mallory")
    assert breaker.state == "closed"
    await fail_as(breaker, "alice", 3)
    assert breaker.state == "open"

    unreachable = Breaker("b-blame-2", redis, CONFIG)
    await fail(unreachable, 3)  # no team to blame: the backend's own failure
    assert unreachable.state == "open"


async def fail_as(breaker: Breaker, team: str, times: int) -> None:
    for _ in range(times):
        await breaker.failure(False, team=team)


async def test_one_team_provoking_500s_leaves_the_backend_to_the_others(make_upstream, openai_url):
    upstream = make_upstream(
        "openai",
        [openai_url + "/v1"],
        model_id="brk-blame",
        backend_breaker_failures=2,
        backend_retry_attempts=1,
    )
    control(openai_url, reset=True)
    for _ in range(5):
        with pytest.raises(BackendUnavailable):
            await upstream.complete(chat("crash #status=500", team="mallory"))
    await upstream.refresh()
    assert upstream.info.circuit == "closed" and upstream.info.ready
    assert (await upstream.complete(chat("hi", team="alice"))).status == 200


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    """The waits between attempts, whatever tenacity 8-9 is installed (9.2 renamed the argument
    the gateway had used, which broke every retry under 9.1)."""
    guard = Guard(ModelInfo("m"), RetryPolicy(backoff_s=0.25, backoff_max_s=1.5))
    failed: Future[None] = Future(1)
    failed.set_exception(Retryable("connection refused"))
    waits = {}
    for attempt in (1, 2, 3, 4):
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number, state.outcome = attempt, failed
        waits[attempt] = [guard._wait(state) for _ in range(200)]
    for attempt, base in ((1, 0.25), (2, 0.5), (3, 1.0)):
        assert base <= min(waits[attempt]) and max(waits[attempt]) <= min(base + 0.25, 1.5)
        assert max(waits[attempt]) - min(waits[attempt]) > 0.1  # jittered
    assert max(waits[4]) <= 1.5  # 2.0 + jitter, capped
