"""The engine backend over two replicas (tests/gateway/fake_upstream.py): load aggregation, choice
by load, prefix affinity within the load margin, skipping a failed replica, a stream cut, and when
a cut counts against the model's breaker."""

import json
import time

import pytest

from tests.backends.conftest import control, free_port, stats
from tokenyard.backends.base import BackendUnavailable, UpstreamBroken, UpstreamCall
from tokenyard.backends.engine import EngineUpstream


def chat(system: str, user: str = "hello", **extra: object) -> UpstreamCall:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    body = {"model": "fake", "messages": messages, "max_tokens": 4, **extra}
    return UpstreamCall("/v1/chat/completions", json.dumps(body).encode(), {}, prefix=system)


def counts(urls: list[str]) -> list[int]:
    return [stats(url)["requests"] for url in urls]


def served(before: list[int], urls: list[str]) -> list[int]:
    return [after - b for after, b in zip(counts(urls), before, strict=True)]


@pytest.fixture
async def engine(make_upstream, engines):
    for url in engines:
        control(url, waiting=0)
    upstream = make_upstream("self-hosted", engines, model_id="fake")
    await upstream.refresh()
    return upstream


async def test_info_aggregates_the_replicas(engine: EngineUpstream, engines):
    assert engine.info.ready and engine.info.provider == "self-hosted"
    assert engine.info.block_size == 16 and engine.info.max_model_len == 2048
    control(engines[0], waiting=7)
    control(engines[1], waiting=3)
    await engine.refresh()
    assert engine.info.waiting == 3  # the least-loaded replica's
    assert engine.info.kv_usage == 0.0


async def test_requests_go_to_the_least_loaded_replica(engine: EngineUpstream, engines):
    control(engines[0], waiting=10)
    await engine.refresh()
    before = counts(engines)
    for i in range(4):
        assert (await engine.complete(chat(f"distinct prefix {i}"))).status == 200
    assert served(before, engines) == [0, 4]


async def test_a_shared_prefix_sticks_to_one_replica(engine: EngineUpstream, engines):
    before = counts(engines)
    for i in range(6):
        await engine.refresh()  # the poll: its load stays within the margin
        await engine.complete(chat("You are a helpful assistant. " * 20, f"question {i}"))
    assert sorted(served(before, engines)) == [0, 6]
    before = counts(engines)
    for i in range(20):
        await engine.refresh()
        await engine.complete(chat(f"system prompt number {i}"))
    assert min(served(before, engines)) > 0  # different prefixes spread over both


async def test_affinity_yields_when_its_replica_is_loaded_past_the_margin(
    engine: EngineUpstream, engines
):
    prompt = "A long shared system prompt. " * 10
    before = counts(engines)
    await engine.complete(chat(prompt))
    home = served(before, engines).index(1)
    control(engines[home], waiting=3)  # margin is 2
    await engine.refresh()
    before = counts(engines)
    await engine.complete(chat(prompt))
    assert served(before, engines)[1 - home] == 1
    control(engines[home], waiting=2)  # back within the margin
    await engine.refresh()
    before = counts(engines)
    await engine.complete(chat(prompt))
    assert served(before, engines)[home] == 1


async def test_a_failed_replica_is_retried_elsewhere_and_skipped(make_upstream, engines):
    dead = f"http://127.0.0.1:{free_port()}"
    upstream = make_upstream("self-hosted", [dead, engines[0]], model_id="fake")
    # no poll yet, so neither is known ready: a prefix whose affinity is the dead one
    prefix = next(p for p in map(str, range(100)) if upstream.pick(chat(p).prefix).url == dead)
    before = counts(engines[:1])
    assert (await upstream.complete(chat(prefix))).status == 200
    assert served(before, engines[:1]) == [1]
    down = next(r for r in upstream.replicas if r.url == dead)
    assert down.down_until > time.monotonic()
    assert upstream.pick(chat(prefix).prefix).url == engines[0]
    await upstream.refresh()
    assert upstream.info.ready and not down.ready


async def test_no_replica_reachable_is_unavailable(make_upstream):
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    upstream = make_upstream("self-hosted", urls, model_id="fake")
    await upstream.refresh()
    assert not upstream.info.ready
    with pytest.raises(BackendUnavailable):
        await upstream.complete(chat("hi"))
    with pytest.raises(BackendUnavailable):
        await upstream.open_stream(chat("hi", stream=True))


async def test_stream_and_a_cut_mid_way(engine: EngineUpstream, engines):
    stream = await engine.open_stream(chat("s", "#chunks=3", stream=True))
    raw = b"".join([c async for c in stream.chunks()])
    await stream.aclose()
    assert raw.count(b'"tok "') == 3 and raw.endswith(b"data: [DONE]\n\n")
    before = counts(engines)
    stream = await engine.open_stream(chat("s", "#chunks=8 #fail=3", stream=True))
    got = []
    with pytest.raises(UpstreamBroken):
        async for chunk in stream.chunks():
            got.append(chunk)
    await stream.aclose()
    assert b"".join(got).count(b'"tok "') == 3
    assert sum(served(before, engines)) == 1  # never retried


async def _cut(upstream: EngineUpstream) -> str:
    """Open a stream that breaks after one chunk; the URL of the replica that served it."""
    before = [r.down_until for r in upstream.replicas]
    stream = await upstream.open_stream(chat("s", "#chunks=8 #fail=1", stream=True))
    with pytest.raises(UpstreamBroken):
        async for _ in stream.chunks():
            pass
    await stream.aclose()
    cooled = [r for r, b in zip(upstream.replicas, before, strict=True) if r.down_until > b]
    assert len(cooled) == 1  # the replica whose stream broke is skipped for a while
    return cooled[0].url


async def test_a_broken_stream_opens_the_breaker_only_when_no_replica_is_left(
    make_upstream, engines
):
    """A replica crash breaks all its streams at once: with another replica ready that must not
    open the model's breaker (requests move over); with none left, it does."""
    upstream = make_upstream("self-hosted", engines, model_id="brk", backend_breaker_failures=1)
    await upstream.refresh()
    broke = await _cut(upstream)
    assert upstream.info.circuit == "closed"
    before = counts(engines)
    assert (await upstream.complete(chat("s"))).status == 200
    assert served(before, engines)[engines.index(broke)] == 0
    alone = make_upstream("self-hosted", engines[:1], model_id="brk1", backend_breaker_failures=1)
    await alone.refresh()
    await _cut(alone)
    assert alone.info.circuit == "open"


async def test_an_engine_refusal_passes_through(engine: EngineUpstream, engines):
    before = counts(engines)
    stream = await engine.open_stream(chat("s", "#status=400", stream=True))
    assert stream.status == 400 and b"refused" in await stream.read_all()
    assert sum(served(before, engines)) == 1


async def test_requests_count_as_load_while_in_flight(engine: EngineUpstream, engines):
    """A replica's load between polls includes this process's requests on it, until each is read
    or its stream closed (once, however often it is closed)."""
    stream = await engine.open_stream(chat("s", "#chunks=3", stream=True))
    assert sum(r.in_flight for r in engine.replicas) == 1
    await engine.complete(chat("s"))  # read whole: done at once
    assert sum(r.in_flight for r in engine.replicas) == 1
    await stream.aclose()
    await stream.aclose()
    refused = await engine.open_stream(chat("s", "#status=400", stream=True))
    assert refused.status == 400
    assert [r.in_flight for r in engine.replicas] == [0, 0]
