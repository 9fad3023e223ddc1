"""A job's life beyond the happy path: a gateway killed mid-job, cancel, the completion window,
and the inline form's callback."""

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import httpx
import pytest
from sqlmodel import Session, select
from standardwebhooks import Webhook, WebhookVerificationError

from tests.batch.conftest import FAST, MODEL, line, read_lines, submit, wait_final
from tests.gateway.conftest import upstream_stats, wait_until
from tokenyard.batch.models import BatchRequest


def _rows(sql: Any, batch_id: str) -> list[BatchRequest]:
    with Session(sql) as session:
        return list(session.exec(select(BatchRequest).where(BatchRequest.batch_id == batch_id)))


def _seen(upstream: str, team: str) -> dict[str, float]:
    """What the upstream saw of one team's requests (the shared database may hold other tests'
    unfinished work, which the gateways of a test also pick up)."""
    return upstream_stats(upstream)["tenants"].get(team, {"requests": 0, "cancelled": 0})


def test_restart_mid_job_resumes_without_redoing(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    settings = {**FAST, "batch_max_concurrency": "2"}
    first = start_gateway(**settings)
    name, key = team()
    items = [line(f"r{i}", "slow #chunks=2 #delay=0.4", max_tokens=2) for i in range(8)]
    batch = submit(first.client(key), items)

    # kill -9 once some requests are done and others are on their way
    wait_until(lambda: sum(r.state == "done" for r in _rows(sql, batch.id)) >= 2, 30, "progress")
    first.proc.kill()
    first.proc.wait()
    finished = {r.id: r.request_id for r in _rows(sql, batch.id) if r.state == "done"}
    assert 2 <= len(finished) < len(items)

    second = start_gateway(**settings)
    done = wait_final(second.client(key), batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(items)
    output = read_lines(second.client(key), done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(i["custom_id"] for i in items)
    # requests finished before the kill kept their first (and only) answer
    assert {o["id"]: o["response"]["request_id"] for o in output if o["id"] in finished} == finished
    # the upstream answered every request exactly once: the only repeats are the ones the kill
    # cut off mid-way (the upstream saw their connection drop)
    seen = _seen(upstream, name)
    assert seen["requests"] - seen["cancelled"] == len(items)


def test_two_gateways_share_a_job_without_running_a_request_twice(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    # a lease far longer than a request: this is about exclusive claims, not expiry (a 2 s lease
    # could lapse on a loaded machine while its holder's poll loop waits on SQLite)
    settings = {**FAST, "batch_lease_s": "15", "batch_max_concurrency": "3"}
    gateways = [start_gateway(**settings) for _ in range(2)]
    name, key = team()
    items = [line(f"r{i}", "#chunks=2 #delay=0.1", max_tokens=2) for i in range(16)]
    batch = submit(gateways[0].client(key), items)
    done = wait_final(gateways[1].client(key), batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(items)
    output = read_lines(gateways[1].client(key), done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(i["custom_id"] for i in items)
    # a request cut off mid-way (yielding to interactive traffic) runs again
    seen = _seen(upstream, name)
    assert seen["requests"] - seen["cancelled"] == len(items)
    assert len({r.lease_owner for r in _rows(sql, batch.id)}) == 2  # both took part


def test_batch_yields_to_interactive_traffic(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    """While interactive requests are in flight, batch shrinks to its shared concurrency: the
    newest batch requests are dropped at the engine and run again later, none lost or doubled."""
    # its requests take 2 s, as long as FAST's lease: this is about yielding, not about a lease
    # that lapses while its holder waits for the CPU
    gw = start_gateway(
        **{**FAST, "batch_lease_s": "15"},
        batch_max_concurrency="4",
        batch_shared_concurrency="1",
        batch_interactive_hold_s="0.5",
    )
    name, key = team()
    client = gw.client(key)
    items = [line(f"r{i}", "#chunks=2 #delay=1", max_tokens=2) for i in range(8)]
    batch = submit(client, items)

    def running() -> int:
        return sum(r.state == "running" for r in _rows(sql, batch.id))

    wait_until(lambda: running() == 4, 30, "batch at full concurrency")
    chat = [{"role": "user", "content": "a person waits #chunks=20 #delay=0.2"}]
    person = threading.Thread(
        target=lambda: list(
            client.chat.completions.create(model=MODEL, messages=chat, max_tokens=20, stream=True)
        )
    )
    person.start()
    wait_until(lambda: running() == 1, 10, "batch held to its shared concurrency")

    def dropped() -> int:
        return _seen(upstream, name)["cancelled"]

    wait_until(lambda: dropped() == 3, 10, "the yielded requests dropped at the engine")
    person.join()

    done = wait_final(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == len(items)
    output = read_lines(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(i["custom_id"] for i in items)


def test_cancel(start_gateway: Any, team: Any, upstream: str) -> None:
    gw = start_gateway(**FAST, batch_max_concurrency="1")
    name, key = team()
    client = gw.client(key)
    items = [line(f"r{i}", "slow #chunks=2 #delay=0.3", max_tokens=2) for i in range(6)]
    batch = submit(client, items)
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1, 30, "one")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at

    done = wait_final(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    counts = done.request_counts
    assert counts.completed >= 1 and counts.completed + counts.failed == len(items)
    assert counts.completed < len(items)
    errors = read_lines(client, done.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert len(read_lines(client, done.output_file_id)) == counts.completed
    assert _seen(upstream, name)["requests"] < len(items)  # the rest never ran


def test_window_expiry_delivers_what_was_done(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST, batch_max_concurrency="1", batch_window_s="2")
    client = gw.client(team()[1])
    items = [line(f"r{i}", "slow #chunks=2 #delay=0.3", max_tokens=2) for i in range(10)]
    batch = submit(client, items)
    assert batch.expires_at - batch.created_at == 2

    done = wait_final(client, batch.id)
    assert done.status == "expired" and done.expired_at is not None
    output = read_lines(client, done.output_file_id)
    errors = read_lines(client, done.error_file_id)
    assert 1 <= len(output) < len(items)  # about 3 fit in the window
    assert all(o["response"]["status_code"] == 200 for o in output)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    got = sorted(o["custom_id"] for o in output + errors)
    assert got == sorted(i["custom_id"] for i in items)


class _Callbacks(BaseHTTPRequestHandler):
    """Answers 500 to the first POST, 200 after; keeps what it was sent (body, headers)."""

    received: ClassVar[list[tuple[bytes, dict[str, str]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((body, dict(self.headers)))
        self.send_response(500 if len(self.received) == 1 else 200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_inline_batch_with_signed_callback(start_gateway: Any, team: Any) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Callbacks)
    _Callbacks.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # callbacks reach only public addresses unless the operator allows more
        gw = start_gateway(**FAST, batch_callback_backoff_s="0.2", batch_callback_allow="127.0.0.1")
        _, key = team()
        requests = [{"custom_id": f"q{i}", "body": line("x")["body"]} for i in range(3)]
        requests.append({"body": line("y")["body"]})  # no custom_id: named by position
        reply = httpx.post(
            gw.url + "/v1/batch",
            headers={"authorization": f"Bearer {key}"},
            json={
                "requests": requests,
                "callback_url": f"http://127.0.0.1:{server.server_port}/done",
                "priority": 5,
            },
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["batch_id"].startswith("batch_") and answer["estimated_completion"] > 0

        wait_until(lambda: len(_Callbacks.received) >= 2, 30, "the callback's retry")
        (first, first_headers), (body, headers) = _Callbacks.received[:2]
        assert first == body  # the same delivery, attempted again, under the same webhook-id
        assert first_headers["webhook-id"] == headers["webhook-id"] == answer["batch_id"]
        # signed per Standard Webhooks with the team's secret, and no other team's
        secrets = [
            httpx.get(
                gw.url + "/v1/batch/webhook_secret", headers={"authorization": f"Bearer {k}"}
            ).json()["secret"]
            for k in (key, team()[1])
        ]
        retry = Webhook(secrets[0]).verify(body, headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(secrets[1]).verify(body, headers)
        assert retry["id"] == answer["batch_id"] and retry["status"] == "completed"
        assert retry["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
        client = gw.client(key)
        output = read_lines(client, retry["output_file_id"])
        assert sorted(o["custom_id"] for o in output) == ["3", "q0", "q1", "q2"]
    finally:
        server.shutdown()
