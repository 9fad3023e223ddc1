"""The batch tier through the official openai SDK: round trip, malformed lines, team isolation."""

from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from sqlmodel import Session, select

from tests.batch.conftest import FAST, MODEL, jsonl, line, read_lines, submit, wait_final
from tests.gateway.conftest import HERE, upstream_stats, wait_until
from tests.webhook_receiver import receiving
from tokenyard.billing.models import UsageRecord
from tokenyard.gateway.quotas import day_number
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.changes import list_changes
from tokenyard.tenancy.webhook_secrets import team_secret


def test_sdk_round_trip(start_gateway: Any, team: Any, upstream: str, sql: Any) -> None:
    gw = start_gateway(**FAST)
    name, key = team()
    client = gw.client(key)
    hooks = ExitStack()
    received = hooks.enter_context(receiving())  # the team's receiver of its events
    teams.update_team(sql, name, webhook_url=f"http://127.0.0.1:{received.port}/events")
    items = [line(f"req-{i}", f"question {i} #chunks=3") for i in range(6)]
    items.append(line("auto-1", "routed by the classifier #chunks=3", model="auto"))
    items[0]["body"] |= {"store": True, "metadata": {"line": "req-0"}}  # kept, as interactive
    batch = submit(client, items, metadata={"project": "nightly"})
    assert batch.status == "in_progress" and batch.metadata == {"project": "nightly"}
    assert batch.request_counts.total == 7

    done = wait_final(client, batch.id)
    assert done.status == "completed" and done.completed_at is not None
    assert done.error_file_id is None, read_lines(client, done.error_file_id)
    assert (done.request_counts.completed, done.request_counts.failed) == (7, 0)
    output = read_lines(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(i["custom_id"] for i in items)
    for o in output:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200
        assert o["response"]["body"]["choices"][0]["message"]["content"] == "tok " * 3
    out_file = client.files.retrieve(done.output_file_id)
    assert out_file.purpose == "batch_output"
    # the batch tier reached the engine as such, and billing recorded each request to the team's key
    headers = upstream_stats(upstream)["last_headers"]
    assert headers["x-priority"] == "batch" and headers["x-tenant"] == name

    def billed() -> list[UsageRecord]:
        with Session(sql) as session:
            return list(session.exec(select(UsageRecord).where(UsageRecord.team == name)))

    wait_until(lambda: len(billed()) == 7, 30, "usage records")
    assert {(r.tier, r.key_prefix, r.status) for r in billed()} == {("batch", key[:12], 200)}
    assert [b.id for b in client.batches.list()] == [batch.id]
    stored = client.chat.completions.list().data
    first = next(o for o in output if o["custom_id"] == "req-0")["response"]["body"]
    assert [c.id for c in stored] == [first["id"]]
    assert stored[0].metadata == {"line": "req-0"}  # type: ignore[attr-defined]
    assert stored[0].choices[0].message.content == "tok " * 3
    # the team's receiver heard of the end as OpenAI's batch.completed, signed with its secret
    with hooks:
        wait_until(lambda: len(received) == 1, 10, "the batch's event")
    reader = openai.OpenAI(api_key="unused", webhook_secret=team_secret(sql, name))
    event = reader.webhooks.unwrap(received[0][1], received[0][2])
    assert (event.type, event.data.id) == ("batch.completed", batch.id)


def test_a_team_sets_its_own_receiver_held_to_the_allowed_networks(
    start_gateway: Any, team: Any, sql: Any
) -> None:
    """A team points its events at its own receiver with one of its keys: a public address, or a
    network the operator allows callbacks (here loopback); never over the operator's own."""
    gw = start_gateway(**FAST, batch_callback_allow="127.0.0.1/32")
    name, key = team()
    api = httpx.Client(base_url=gw.url + "/v1", headers={"authorization": f"Bearer {key}"})
    assert api.get("/batch/webhook_url").json() == {
        "object": "batch.webhook_url",
        "url": None,
        "set_by": None,
    }
    refused = api.post("/batch/webhook_url", json={"url": "http://10.1.2.3/hook"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "url"
    with receiving() as received:
        url = f"http://127.0.0.1:{received.port}/mine"
        chosen = api.post("/batch/webhook_url", json={"url": url}).json()
        assert (chosen["url"], chosen["set_by"]) == (url, "team")
        batch = gw.client(key).batches.create(  # the inline form's twin: a file's batch
            input_file_id=gw.client(key)
            .files.create(file=("in.jsonl", jsonl([line("a")])), purpose="batch")
            .id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        assert wait_final(gw.client(key), batch.id).status == "completed"
        wait_until(lambda: len(received) == 1, 10, "the batch's event at the team's receiver")
    reader = openai.OpenAI(api_key="unused", webhook_secret=team_secret(sql, name))
    assert reader.webhooks.unwrap(received[0][1], received[0][2]).data.id == batch.id
    (change, *_) = list_changes(sql, name)
    assert (change.action, change.actor) == ("team.webhook", f"team-api:{key[:12]}")
    # the operator's receiver is the operator's: the team can neither replace nor clear it
    teams.update_team(sql, name, webhook_url="http://10.9.9.9/operators")
    assert api.get("/batch/webhook_url").json()["set_by"] == "operator"
    for body in ({"url": url}, {"url": None}):
        denied = api.post("/batch/webhook_url", json=body)
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "set_by_operator"
    api.close()


def test_malformed_lines_go_to_the_error_file(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    _, key = team()
    client = gw.client(key)
    good = [line("a"), line("b")]
    content = (
        jsonl(good)
        + b"{oops\n"
        + jsonl(
            [
                {**line("c"), "url": "/v1/embeddings"},
                {k: v for k, v in line("d").items() if k != "custom_id"},
                line("a"),
                line("e", "refused upstream #status=400"),
            ]
        )
    )
    uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_final(client, batch.id)
    assert done.status == "completed"
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (7, 2, 5)
    assert sorted(o["custom_id"] for o in read_lines(client, done.output_file_id)) == ["a", "b"]
    errors = read_lines(client, done.error_file_id)
    codes = sorted((e["error"] or {}).get("code", "") for e in errors)
    assert codes == [
        "",
        "duplicate_custom_id",
        "invalid_json_line",
        "invalid_url",
        "missing_custom_id",
    ]
    # a request the model refused has its response in the error file, as OpenAI's do
    [refused] = [e for e in errors if e["response"] is not None]
    assert refused["custom_id"] == "e" and refused["response"]["status_code"] == 400


def test_a_job_runs_under_the_models_of_the_key_that_made_it(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    """A key narrowed to some of its team's models makes a batch job that runs under those models:
    a line for another model the team may use fails alone, with the 404 the same request gets
    through that key, and the others complete."""
    gw = start_gateway(
        **FAST,
        catalog=str(HERE / "catalog_capabilities.toml"),
        engine_urls=f"plain={upstream},{MODEL}={upstream}",
    )
    name, _ = team()
    narrowed = keys.create_key(sql, name, "plain only", models=["plain"]).key
    client = gw.client(narrowed)
    with pytest.raises(openai.NotFoundError):  # interactively, as the baseline
        client.chat.completions.create(**line("x", model=MODEL)["body"])
    batch = submit(client, [line("mine", model="plain"), line("not-mine", model=MODEL)])
    done = wait_final(client, batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    assert [o["custom_id"] for o in read_lines(client, done.output_file_id)] == ["mine"]
    [refused] = read_lines(client, done.error_file_id)
    assert refused["custom_id"] == "not-mine" and refused["response"]["status_code"] == 404
    assert refused["response"]["body"]["error"]["code"] == "model_not_found"


def test_bad_requests_are_refused_up_front(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    _, key = team()
    client = gw.client(key)
    uploaded = client.files.create(file=("in.jsonl", jsonl([line("a")])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/moderations", completion_window="24h"
        )
    assert err.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="1h"
        )
    assert err.value.body["param"] == "completion_window"
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("in.jsonl", b"{}"), purpose="fine-tune")
    assert err.value.body["param"] == "purpose"


def test_a_team_sees_only_its_own(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    owner = gw.client(team()[1])
    other = gw.client(team()[1])
    batch = submit(owner, [line("a")])
    file_id = batch.input_file_id
    for call in (
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(other.batches.list()) == []
    assert wait_final(owner, batch.id).status == "completed"  # and the owner's job is untouched


def test_daily_batch_budget(
    start_gateway: Any, team: Any, redis_server: Any, upstream: str
) -> None:
    """Batch spends its own daily budget: over it, batch requests are refused (and the job's wait
    until its window ends), while the team's interactive traffic is unaffected."""
    gw = start_gateway(batch_window_s="4", **FAST)
    name, key = team(batch_tokens_per_day=60)
    client = gw.client(key)
    chat = [{"role": "user", "content": "hi #chunks=2"}]
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(
            model=MODEL, messages=chat, max_tokens=100, extra_headers={"x-tier": "batch"}
        )
    assert err.value.code == "batch_tokens_per_day"
    interactive = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=100)
    assert interactive.choices[0].finish_reason == "length"

    batch = submit(
        client, [line("small", "hi #chunks=2", max_tokens=20), line("big", max_tokens=100)]
    )
    done = wait_final(client, batch.id, timeout=30)
    assert done.status == "expired" and done.expired_at is not None
    assert [o["custom_id"] for o in read_lines(client, done.output_file_id)] == ["small"]
    [late] = read_lines(client, done.error_file_id)
    assert late["custom_id"] == "big" and late["error"]["code"] == "batch_expired"
    r = redis_server.client()
    spent = int(r.get(f"ty:{{{name}}}:batch-tokens:{day_number()}") or 0)
    assert 0 < spent <= 60


def test_files_list_and_delete_are_team_scoped(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    _, key_a = team()
    _, key_b = team()
    a, b = gw.client(key_a), gw.client(key_b)
    ids = [
        a.files.create(file=(f"f{i}.jsonl", jsonl([line(f"r{i}", "hi")])), purpose="batch").id
        for i in range(3)
    ]
    b.files.create(file=("b.jsonl", jsonl([line("r", "hi")])), purpose="batch")
    assert [f.id for f in a.files.list()] == ids[::-1]  # newest first, only the team's own
    page = a.files.list(limit=2)
    assert [f.id for f in page.data] == ids[:0:-1] and page.has_more
    assert [f.id for f in a.files.list(after=ids[1])] == [ids[0]]
    with pytest.raises(openai.NotFoundError):
        b.files.delete(ids[0])  # another team's file is as absent as a missing one
    assert a.files.delete(ids[0]).deleted
    with pytest.raises(openai.NotFoundError):
        a.files.retrieve(ids[0])
    assert [f.id for f in a.files.list()] == ids[:0:-1]
