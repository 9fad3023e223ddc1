"""Input lines and output lines, and the worker's own logic, without a gateway."""

import asyncio
from pathlib import Path

import msgspec
import pytest
from sqlmodel import Session, select

from tokenyard.batch import jobs, lifecycle
from tokenyard.batch.files import Line, check_items, output_line, parse_lines
from tokenyard.batch.models import BatchRequest
from tokenyard.batch.worker import BatchWorker, _Running
from tokenyard.core.db import get_engine
from tokenyard.core.settings import Settings
from tokenyard.gateway.exchange import complete_unless_gone

CHAT = "/v1/chat/completions"


def test_malformed_lines_are_reported_not_fatal() -> None:
    good = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "m", "stream": True}}
    content = b"\n".join(
        [
            msgspec.json.encode(good),
            b"{not json",
            msgspec.json.encode({**good, "custom_id": "b", "url": "/v1/embeddings"}),
            msgspec.json.encode({k: v for k, v in good.items() if k != "custom_id"}),
            msgspec.json.encode(good),  # custom_id "a" again
            msgspec.json.encode({**good, "custom_id": "c", "method": "GET"}),
            msgspec.json.encode({**good, "custom_id": "d", "body": "text"}),
            b"   ",  # blank lines are not requests
        ]
    )
    lines = parse_lines(content, CHAT)
    assert [ln.error[0] if ln.error else None for ln in lines] == [
        None,
        "invalid_json_line",
        "invalid_url",
        "missing_custom_id",
        "duplicate_custom_id",
        "invalid_method",
        "invalid_body",
    ]
    # batch replies are whole objects: a streaming flag is dropped, not forwarded
    assert msgspec.json.decode(lines[0].body) == {"model": "m"}


def test_inline_items_default_custom_id_to_position() -> None:
    items = [{"body": {"model": "m"}}, {"custom_id": "x", "body": {"model": "m"}}]
    lines = check_items([msgspec.Raw(msgspec.json.encode(i)) for i in items], CHAT)
    assert [ln.custom_id for ln in lines] == ["0", "x"]
    assert all(ln.error is None for ln in lines)


def test_lines_too_deep_or_with_odd_ids_fail_alone() -> None:
    """Neither reaches SQL (PostgreSQL refuses a NUL in text) nor fails the file."""
    good = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "m"}}
    content = b"\n".join(
        [
            b"[" * 10_000 + b"]" * 10_000,
            msgspec.json.encode({**good, "custom_id": "x" * 513}),
            msgspec.json.encode({**good, "custom_id": "nul\x00"}),
            msgspec.json.encode(good),
        ]
    )
    lines = parse_lines(content, CHAT)
    assert [(ln.custom_id, ln.error[0] if ln.error else None) for ln in lines] == [
        (None, "invalid_json_line"),
        (None, "invalid_custom_id"),
        (None, "invalid_custom_id"),
        ("a", None),
    ]


def test_output_line_shapes() -> None:
    ok = msgspec.json.decode(output_line("r1", "a", 200, "req-1", b'{"id": "c"}', None))
    assert ok == {
        "id": "r1",
        "custom_id": "a",
        "response": {"status_code": 200, "request_id": "req-1", "body": {"id": "c"}},
        "error": None,
    }
    failed = msgspec.json.decode(output_line("r2", None, None, None, None, ("code", "why")))
    assert failed["response"] is None and failed["error"] == {"code": "code", "message": "why"}


async def test_leases_renew_while_a_tick_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tick stuck on SQL contention or a slow callback must not let a running request's lease
    lapse (another gateway would claim it and send it upstream a second time)."""
    renewed: list[list[str]] = []
    monkeypatch.setattr(lifecycle, "renew", lambda sql, owner, ids, lease_s: renewed.append(ids))
    ticking = asyncio.Event()

    async def stuck(self: BatchWorker) -> None:
        ticking.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(BatchWorker, "tick", stuck)
    worker = BatchWorker(None, None, Settings(batch_lease_s=0.3), None)  # type: ignore[arg-type]
    request = asyncio.create_task(asyncio.sleep(30))
    worker.running["req-1"] = _Running("batch-1", request, asyncio.Event())
    worker.start()
    await ticking.wait()
    await asyncio.sleep(0.6)  # two lease lifetimes, all inside one tick
    assert len(renewed) >= 3 and all(ids == ["req-1"] for ids in renewed)
    request.cancel()
    worker.running.clear()
    await worker.stop()


def test_interactive_traffic_never_raises_batch_concurrency() -> None:
    settings = Settings(batch_max_concurrency=3, batch_shared_concurrency=4)
    worker = BatchWorker(None, None, settings, None)  # type: ignore[arg-type]
    # a limit above the usual one would start extra requests, then yield them once interactive
    # traffic is gone
    assert worker.limit(True) == 3 and worker.limit(False) == 3
    assert BatchWorker(None, None, Settings(batch_max_concurrency=8), None).limit(True) == 4  # type: ignore[arg-type]


class _Upstream:
    """Replies when told to; notes whether its call was dropped."""

    def __init__(self) -> None:
        self.reply = asyncio.Event()
        self.dropped = False

    async def complete(self, call: object) -> bytes:
        try:
            await self.reply.wait()
        except asyncio.CancelledError:
            self.dropped = True
            raise
        return b"{}"


class _Proxy:
    """The gateway's request path reduced to what a yield can interrupt: the wait on the upstream
    (the gateway's own hang-up handling), then settling."""

    def __init__(self) -> None:
        self.upstream = _Upstream()
        self.settling = asyncio.Event()
        self.settled = asyncio.Event()

    async def run_detached(self, *args: object) -> tuple[int, bytes, str]:
        hang_up = args[-1]
        reply = await complete_unless_gone(hang_up, self.upstream, None)  # type: ignore[arg-type]
        self.settling.set()
        await self.settled.wait()
        return 200, reply, "fake"


async def _run_and_yield(monkeypatch: pytest.MonkeyPatch, after_reply: bool) -> tuple[list, _Proxy]:
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(
        lifecycle, "release", lambda sql, owner, rid, nb: calls.append(("release", nb))
    )
    monkeypatch.setattr(
        lifecycle,
        "finish",
        lambda sql, owner, rid, **kw: calls.append(("finish", kw["status_code"])),
    )

    async def policy(self: BatchWorker, team: str, key_prefix: str) -> object:
        return object()

    monkeypatch.setattr(BatchWorker, "_policy", policy)
    proxy = _Proxy()
    worker = BatchWorker(proxy, None, Settings(), None)  # type: ignore[arg-type]
    request = lifecycle.Claimed("r1", "b1", "team", "key", CHAT, b"{}", 1)
    hung_up = asyncio.Event()
    task = asyncio.create_task(worker._execute(request, hung_up))
    if after_reply:
        proxy.upstream.reply.set()
        await asyncio.wait_for(proxy.settling.wait(), 5)  # a failed request never sets it
        hung_up.set()  # the worker yields it while the gateway settles the reply
        await asyncio.sleep(0.01)
        proxy.settled.set()
    else:
        await asyncio.sleep(0.01)
        hung_up.set()
    await asyncio.wait_for(task, 5)
    return calls, proxy


async def test_a_yield_while_waiting_drops_the_upstream_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, proxy = await _run_and_yield(monkeypatch, after_reply=False)
    assert proxy.upstream.dropped and calls == [("release", 0.0)]


async def test_a_yield_after_the_reply_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # giving it back would send it upstream a second time (CI once saw 18 upstream calls for 16
    # batch lines)
    calls, proxy = await _run_and_yield(monkeypatch, after_reply=True)
    assert not proxy.upstream.dropped and calls == [("finish", 200)]


def test_a_claim_never_takes_a_request_another_gateway_just_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two gateways select the same pending requests; the second to update one must lose it,
    even when the other's claim lands between its own claims (CI once saw two gateways each run
    a request: 18 upstream calls for 16 lines)."""
    sql = get_engine(f"sqlite:///{tmp_path}/claims.db")
    lines = [Line(custom_id=f"r{i}", body=b"{}", error=None) for i in range(2)]
    job = jobs.create_job(sql, team="t", key_prefix="k", endpoint=CHAT, lines=lines, window_s=3600)
    real_commit = Session.commit
    interleaved: list[list[lifecycle.Claimed]] = []

    def commit_then_other_gateway_claims(self: Session) -> None:
        real_commit(self)
        if not interleaved:  # after A's first claim, B claims what is left (line 1)
            interleaved.append([])  # first, so B's own commits do not recurse here
            interleaved[0] = lifecycle.claim(sql, "gateway-b", 60, 10)

    monkeypatch.setattr(Session, "commit", commit_then_other_gateway_claims)
    first = lifecycle.claim(sql, "gateway-a", 60, 10)
    monkeypatch.undo()
    assert [c.id for c in first] != [] and [c.id for c in interleaved[0]] != []
    assert not {c.id for c in first} & {c.id for c in interleaved[0]}
    with Session(sql) as session:
        rows = session.exec(select(BatchRequest).where(BatchRequest.batch_id == job.id)).all()
        assert sorted(r.attempts for r in rows) == [1, 1]
