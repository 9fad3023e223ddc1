"""Anthropic's Message Batches through the official anthropic SDK, unchanged: a batch of Messages
requests runs on the batch tier (the fake upstream), its results come back as Anthropic's JSONL
(succeeded with a Message, errored with Anthropic's error), it is listed, cancelled and deleted as
Anthropic's API does it, and a team sees only its own."""

import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.batch.conftest import FAST, MODEL

USER = [{"role": "user", "content": "hello there"}]


def _client(gw: Any, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


def _ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"message batch {batch_id} did not end: {batch.processing_status}")


def test_a_batch_runs_and_its_results_are_anthropics(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    _, key = team()
    client = _client(gw, key)
    requests: list[Any] = [
        {"custom_id": "first", "params": {"model": MODEL, "max_tokens": 3, "messages": USER}},
        {
            "custom_id": "second",
            "params": {"model": MODEL, "max_tokens": 2, "system": "be brief", "messages": USER},
        },
        # does not translate (no max_tokens): an errored result, not a refused batch
        {"custom_id": "broken", "params": {"model": MODEL, "messages": USER}},
        # refused when it runs: the model does not exist
        {
            "custom_id": "nowhere",
            "params": {"model": "no-model", "max_tokens": 2, "messages": USER},
        },
    ]
    made = client.messages.batches.create(requests=requests)
    assert made.id.startswith("msgbatch_") and made.type == "message_batch"
    assert made.processing_status == "in_progress" and made.results_url is None
    ended = _ended(client, made.id)
    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (2, 2, 0)
    assert ended.ended_at is not None and ended.results_url

    results = {r.custom_id: r.result for r in client.messages.batches.results(made.id)}
    assert set(results) == {"first", "second", "broken", "nowhere"}
    first = results["first"]
    assert first.type == "succeeded"
    assert first.message.type == "message" and first.message.model == MODEL
    assert first.message.content[0].text == "tok " * 3
    assert first.message.stop_reason == "max_tokens" and first.message.usage.output_tokens == 3
    assert results["broken"].type == "errored"
    assert results["broken"].error.error.type == "invalid_request_error"
    assert "max_tokens" in results["broken"].error.error.message
    assert results["nowhere"].type == "errored"
    assert results["nowhere"].error.error.type == "not_found_error"

    # listed by Anthropic's API (not by OpenAI's, whose jobs are its own), deleted once ended
    listed = client.messages.batches.list(limit=5)
    assert [b.id for b in listed.data] == [made.id]
    openai_client = gw.client(key)
    assert made.id not in [b.id for b in openai_client.batches.list().data]
    deleted = client.messages.batches.delete(made.id)
    assert deleted.id == made.id and deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(made.id)


def test_cancel_list_pages_and_another_team(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(batch_window_s="600", **FAST)
    _, key = team()
    client = _client(gw, key)
    slow = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "#delay=1"}]}
    made = [
        client.messages.batches.create(
            requests=[{"custom_id": f"r{i}", "params": slow} for i in range(20)]
        )
        for _ in range(3)
    ]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == [made[2].id, made[1].id] and page.has_more
    rest = client.messages.batches.list(limit=2, after_id=page.last_id)
    assert [b.id for b in rest.data] == [made[0].id] and not rest.has_more
    newer = client.messages.batches.list(limit=2, before_id=made[0].id)
    assert [b.id for b in newer.data] == [made[2].id, made[1].id]

    with pytest.raises(anthropic.BadRequestError):  # running: cancel it first
        client.messages.batches.delete(made[0].id)
    cancelling = client.messages.batches.cancel(made[0].id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    ended = _ended(client, made[0].id)
    assert ended.request_counts.canceled > 0
    kinds = {r.result.type for r in client.messages.batches.results(made[0].id)}
    assert "canceled" in kinds

    _, other_key = team()
    other = _client(gw, other_key)
    assert other.messages.batches.list().data == []
    for call in (
        lambda: other.messages.batches.retrieve(made[1].id),
        lambda: other.messages.batches.cancel(made[1].id),
        lambda: other.messages.batches.delete(made[1].id),
    ):
        with pytest.raises(anthropic.NotFoundError):
            call()
    # OpenAI's routes do not reach an Anthropic batch's lines, nor refuse in the wrong shape
    with pytest.raises(openai.NotFoundError):
        gw.client(other_key).batches.retrieve(made[1].id)


def test_bad_batches_are_refused_in_anthropics_shape(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(**FAST)
    _, key = team()
    client = _client(gw, key)
    for requests in (
        [],
        [{"custom_id": "has space", "params": {}}],
        [{"custom_id": "x", "params": {}, "extra": 1}],
    ):
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    raw = httpx.post(gw.url + "/v1/messages/batches", content=b"{", headers={"x-api-key": key})
    assert raw.status_code == 400 and raw.json()["type"] == "error"
    unauthenticated = httpx.get(gw.url + "/v1/messages/batches")
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("batch_0123")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.list(limit=0)
