"""What a hostile team can send the batch API: callback URLs into the platform's network,
malformed bodies and files, out-of-range values, batches too large, and a large batch that must not
hold up the gateway's other requests. Every refusal is a 400 in OpenAI's shape."""

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import psutil
import pytest
from sqlmodel import Session, select

from tests.batch.conftest import FAST, line
from tests.gateway.conftest import Gateway, wait_until
from tests.webhook_receiver import receiving
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.models import TeamEvent

CAP = 30_000
NESTED = b"[" * 10_000 + b"]" * 10_000


@pytest.fixture(scope="module")
def hardening_gateway(
    base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """One gateway for the module (no callback allow-list)."""
    env = {**base_env, "TOKENYARD_BATCH_MAX_REQUESTS": str(CAP)}
    env |= {f"TOKENYARD_{k.upper()}": v for k, v in FAST.items()}
    gw = Gateway(env, tmp_path_factory.mktemp("hardening") / "gateway.log")
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def api(hardening_gateway: Gateway, sql: Any) -> Callable[..., httpx.Client]:
    """Each call: a new team's client of the module's gateway, its key restricted to `scopes`
    where given."""

    def client(scopes: str | None = None) -> httpx.Client:
        name = "t" + uuid.uuid4().hex[:10]
        teams.create_team(sql, name)
        key = keys.create_key(sql, name, limits={"scopes": scopes} if scopes else None).key
        auth = {"authorization": f"Bearer {key}"}
        return httpx.Client(base_url=hardening_gateway.url, headers=auth)

    return client


def _refused(reply: httpx.Response, param: str | None) -> dict[str, Any]:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


def _inline(**fields: Any) -> dict[str, Any]:
    return {"requests": [{"body": line("x")["body"]}], **fields}


def test_callbacks_into_the_platforms_network_are_refused(api: Callable[..., httpx.Client]) -> None:
    client = api()
    for url in [
        "http://127.0.0.1:9/done",
        "http://localhost:9/",
        "http://0x7f000001:9/",
        "http://2130706433:9/",
        "http://user:pw@127.0.0.1:9/",
        "http://[::1]:9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "gopher://example.com/",
    ]:
        reply = client.post("/v1/batch", json=_inline(callback_url=url))
        error = _refused(reply, "callback_url")
        assert "pw" not in error["message"]


def test_a_batch_runs_only_the_kinds_of_request_its_key_may_send(
    api: Callable[..., httpx.Client],
) -> None:
    """A key restricted to the batch tier cannot reach completions or embeddings through a batch:
    each form of batch is refused with 403 before a job exists."""
    client = api("batch")

    def refused(reply: httpx.Response) -> None:
        assert reply.status_code == 403, reply.text
        error = reply.json()["error"]
        assert error["code"] == "insufficient_scope" and "batch of" in error["message"], error

    upload = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", msgspec.json.encode(line("a")))},
        data={"purpose": "batch"},
    )
    assert upload.status_code == 200, upload.text  # files are the batch tier's own
    create = {"input_file_id": upload.json()["id"], "completion_window": "24h"}
    refused(client.post("/v1/batches", json={**create, "endpoint": "/v1/chat/completions"}))
    assert client.post("/v1/batch", json=_inline()).json()["error"]["param"] == "endpoint"
    embed = {"requests": [{"body": {"model": "m", "input": "x"}}], "endpoint": "/v1/embeddings"}
    refused(client.post("/v1/batch", json=embed))
    ask = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    anthropic_form = client.post(
        "/v1/messages/batches", json={"requests": [{"custom_id": "a", "params": ask}]}
    )
    assert anthropic_form.status_code == 403  # in Anthropic's shape of error
    assert anthropic_form.json()["error"]["type"] == "permission_error", anthropic_form.text

    assert client.get("/v1/batches").json()["data"] == []  # no job was made
    # the same key given completions too: its chat batch is accepted
    both = api("batch,completions")
    accepted = both.post("/v1/batch", json=_inline())
    assert accepted.status_code == 200 and accepted.json()["batch_id"], accepted.text
    refused(both.post("/v1/batch", json=embed))


def test_a_teams_own_receiver_reaches_no_private_address(
    api: Callable[..., httpx.Client], sql: Any
) -> None:
    """Without an allow-list, a team can point its events at public addresses only: refused when
    set, and refused again when sent (a receiver set before the operator narrowed the list)."""
    client = api()
    for url in ("http://127.0.0.1:9/x", "http://169.254.169.254/", "http://[::1]/", "ftp://a.b/"):
        refused = client.post("/v1/batch/webhook_url", json={"url": url})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "url", url
    assert client.get("/v1/batch/webhook_url").json()["url"] is None
    with receiving() as received:
        name = client.get("/v1/usage").json()["team"]
        url = f"http://127.0.0.1:{received.port}/late"
        teams.set_own_webhook(sql, name, url, actor="test")  # as if allowed when it was set
        made = client.post("/v1/batch", json=_inline())
        assert made.status_code == 200, made.text
        wait_until(lambda: _events(sql, name) and _events(sql, name)[0].last_error, 20, "a try")
        assert received == []  # refused before connecting: the receiver is up and heard nothing
    assert _events(sql, name)[0].delivered_at is None


def _events(sql: Any, team: str) -> list[TeamEvent]:
    with Session(sql) as session:
        return list(session.exec(select(TeamEvent).where(TeamEvent.team == team)))


def test_malformed_bodies_are_400s(api: Callable[..., httpx.Client]) -> None:
    client = api()
    for path in ("/v1/batch", "/v1/batches"):
        for body in (b"\xff\xfe{}", b'{"endpoint": "\xff"}', b'{"requests": [' + NESTED + b"]}"):
            _refused(client.post(path, content=body), None)
    for priority in (2**63, 101, -101):
        _refused(client.post("/v1/batch", json=_inline(priority=priority)), "priority")
    for metadata in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}):
        _refused(client.post("/v1/batch", json=_inline(metadata=metadata)), "metadata")
    long_url = "https://example.com/" + "a" * 2048
    _refused(client.post("/v1/batch", json=_inline(callback_url=long_url)), "callback_url")
    assert client.get("/v1/batches", params={"after": "batch_\x00"}).json()["data"] == []
    assert client.get("/v1/batches/batch_%00").status_code == 404


def test_a_bad_file_is_refused_or_fails_alone(api: Callable[..., httpx.Client]) -> None:
    client = api()

    def upload(content: bytes) -> httpx.Response:
        return client.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", content)}
        )

    _refused(upload(msgspec.json.encode(line("a")) + b"\n\xff\xfe\n"), "file")
    form = b'--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\n\xff\r\n--x--\r\n'
    type_ = {"content-type": "multipart/form-data; boundary=x"}
    _refused(client.post("/v1/files", content=form, headers=type_), None)
    _refused(upload(b"{}\n" * (CAP + 1)), "file")
    # JSON too deeply nested to read fails its line, as a malformed line does
    uploaded = upload(NESTED + b"\n" + msgspec.json.encode(line("a")) + b"\n")
    assert uploaded.status_code == 200, uploaded.text
    batch = client.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    assert batch.status_code == 200, batch.text
    assert batch.json()["request_counts"]["total"] == 2


def test_inline_batches_are_capped(api: Callable[..., httpx.Client]) -> None:
    _refused(api().post("/v1/batch", json={"requests": [{}] * (CAP + 1)}), "requests")


def test_a_large_batch_does_not_hold_up_other_requests(
    api: Callable[..., httpx.Client], hardening_gateway: Gateway
) -> None:
    client = api()
    server = psutil.Process(hardening_gateway.proc.pid)
    requests = [{"body": line("a question of some length, as prompts are")["body"]}] * CAP
    body = msgspec.json.encode({"requests": requests})
    slowest = [0.0]
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=str(client.base_url)) as health:
            while not done.is_set():
                started = time.monotonic()
                health.get("/health").raise_for_status()
                slowest[0] = max(slowest[0], time.monotonic() - started)
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    prober.start()
    cpu_before = sum(server.cpu_times()[:2])
    try:
        reply = client.post("/v1/batch", content=body, timeout=60)
    finally:
        done.set()
        prober.join()
    cpu = sum(server.cpu_times()[:2]) - cpu_before
    assert reply.status_code == 200, reply.text
    # measured on an idle 2-core machine: 0.6 s to create, /health within 0.1 s meanwhile (a full
    # garbage collection of the gateway's heap); before, 3.3 to 3.8 s, and /health stalled 0.21 to
    # 0.86 s (21 s and 1.35 s in the issue). The gateway's CPU time, not the wall time, is bounded:
    # the wall time doubled beside another test worker (2.17 s)
    assert cpu < 2.0 and slowest[0] < 0.3, (cpu, slowest)
    cancelled = client.post(f"/v1/batches/{reply.json()['batch_id']}/cancel")  # others share SQL
    assert cancelled.status_code == 200


def test_each_team_has_its_own_webhook_secret(api: Callable[..., httpx.Client]) -> None:
    mine, other = api(), api()
    secret = mine.get("/v1/batch/webhook_secret").json()["secret"]
    assert secret.startswith("whsec_") and mine.get("/v1/batch/webhook_secret").json() == {
        "object": "batch.webhook_secret",
        "secret": secret,
    }
    assert other.get("/v1/batch/webhook_secret").json()["secret"] != secret
    rotated = mine.post("/v1/batch/webhook_secret").json()["secret"]
    assert rotated != secret and mine.get("/v1/batch/webhook_secret").json()["secret"] == rotated
