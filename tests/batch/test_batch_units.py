"""Input lines and output lines, without a gateway."""

import asyncio

import msgspec
import pytest

from batch import jobs
from batch.files import check_items, output_line, parse_lines
from batch.worker import BatchWorker
from tokenyard.settings import Settings

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
    lines = check_items(
        [{"body": {"model": "m"}}, {"custom_id": "x", "body": {"model": "m"}}], CHAT
    )
    assert [ln.custom_id for ln in lines] == ["0", "x"]
    assert all(ln.error is None for ln in lines)


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
    monkeypatch.setattr(jobs, "renew", lambda sql, owner, ids, lease_s: renewed.append(ids))
    ticking = asyncio.Event()

    async def stuck(self: BatchWorker) -> None:
        ticking.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(BatchWorker, "tick", stuck)
    worker = BatchWorker(None, None, Settings(batch_lease_s=0.3))  # type: ignore[arg-type]
    request = asyncio.create_task(asyncio.sleep(30))
    worker.running["req-1"] = ("batch-1", request)
    worker.start()
    await ticking.wait()
    await asyncio.sleep(0.6)  # two lease lifetimes, all inside one tick
    assert len(renewed) >= 3 and all(ids == ["req-1"] for ids in renewed)
    request.cancel()
    worker.running.clear()
    await worker.stop()
