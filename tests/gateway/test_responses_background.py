"""The Responses API's background mode with the official SDK: a response queued at once and
polled to its end, cancelled (the upstream call dropped, the leases given back), deleted while it
runs; what background mode refuses; and a response whose gateway stopped reading as failed."""

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any, cast

import msgspec
import openai
import pytest
import redis.asyncio as aioredis
from sqlmodel import Session, select

from tests.gateway.conftest import (
    Gateway,
    RedisServer,
    free_port,
    reservations,
    upstream_stats,
    wait_until,
)
from tests.openai_spec import problems
from tests.webhook_receiver import receiving
from tokenyard.core.db import get_engine
from tokenyard.core.errors import GatewayError
from tokenyard.core.migrate import upgrade
from tokenyard.gateway.responses.background import Background
from tokenyard.gateway.responses.event_log import KEEP_S, EventLog
from tokenyard.gateway.responses.store import ResponseStore
from tokenyard.gateway.responses.translate import CreateResponse, begin
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.models import TeamEvent
from tokenyard.tenancy.policy import TeamPolicy
from tokenyard.tenancy.webhook_secrets import team_secret

IDLE = {"leases": 0, "pages": 0, "platform_leases": 0}


@pytest.fixture
def team(sql: Any) -> tuple[str, str]:
    name = "bg-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    return name, keys.create_key(sql, name).key


def _ended(client: openai.OpenAI, response_id: str) -> Any:
    """The response once it is no longer queued or in progress."""
    found: list[Any] = []

    def ended() -> bool:
        found[:] = [client.responses.retrieve(response_id)]
        return found[0].status not in ("queued", "in_progress")

    wait_until(ended, 10, "the background response to end")
    return found[0]


def test_a_background_response_is_queued_then_polled_to_its_end(
    capabilities_gw: Gateway, team: tuple[str, str], redis_server: RedisServer
) -> None:
    name, key = team
    client = capabilities_gw.client(key)
    started = time.monotonic()
    made = client.responses.create(
        model="fake", input="Say it #chunks=3 #delay=0.5 #stop", background=True
    )
    assert time.monotonic() - started < 1.0  # answered before the model finished (~1.5 s)
    # a follow-up cannot build on it yet
    with pytest.raises(openai.BadRequestError) as early:
        client.responses.create(model="fake", input="and?", previous_response_id=made.id)
    assert early.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert made.status in ("queued", "in_progress") and made.background is True
    assert made.output == [] and not problems("Response", made.model_dump(mode="json"))
    final = _ended(client, made.id)
    assert final.status == "completed" and final.background is True
    assert final.output_text == "tok tok tok " and final.usage is not None
    assert final.usage.output_tokens == 3
    assert not problems("Response", final.model_dump(mode="json"))
    wait_until(lambda: reservations(redis_server.client(), name) == IDLE, 3, "settled")
    follow = client.responses.create(
        model="fake", input="and? #chunks=1 #stop", previous_response_id=made.id
    )
    assert follow.status == "completed" and follow.background is False
    items = [i.id for i in client.responses.input_items.list(follow.id, order="asc").data]
    assert final.output[0].id in items  # the background turn is the follow-up's context


def test_a_background_response_is_cancelled_and_its_upstream_call_dropped(
    capabilities_gw: Gateway, team: tuple[str, str], redis_server: RedisServer, upstream: str
) -> None:
    name, key = team
    client = capabilities_gw.client(key)
    before = upstream_stats(upstream)["cancelled"]
    slow = client.responses.create(
        model="fake", input="Write at length #chunks=60 #delay=0.2", background=True
    )
    wait_until(lambda: reservations(redis_server.client(), name)["leases"] == 1, 5, "running")
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled" and cancelled.id == slow.id
    # the walk notices within a heartbeat, drops the upstream call and gives its leases back
    wait_until(lambda: reservations(redis_server.client(), name) == IDLE, 6, "the walk stopped")
    wait_until(lambda: upstream_stats(upstream)["cancelled"] == before + 1, 3, "upstream told")
    assert client.responses.retrieve(slow.id).status == "cancelled"
    assert client.responses.cancel(slow.id).status == "cancelled"  # again: as it is
    # a finished background response is returned as it is; one not made in background refused
    done = client.responses.create(model="fake", input="hi #chunks=1 #stop", background=True)
    assert _ended(client, done.id).status == "completed"
    assert client.responses.cancel(done.id).status == "completed"
    plain = client.responses.create(model="fake", input="hi #chunks=1")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(plain.id)
    assert "background" in refused.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nosuch")


def test_a_background_response_deleted_while_it_runs_stays_deleted(
    capabilities_gw: Gateway, team: tuple[str, str], redis_server: RedisServer
) -> None:
    name, key = team
    client = capabilities_gw.client(key)
    slow = client.responses.create(
        model="fake", input="Write at length #chunks=60 #delay=0.2", background=True
    )
    wait_until(lambda: reservations(redis_server.client(), name)["leases"] == 1, 5, "running")
    client.responses.delete(slow.id)
    wait_until(lambda: reservations(redis_server.client(), name) == IDLE, 6, "the walk stopped")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(slow.id)


def test_background_mode_refuses_a_response_it_would_not_store(
    capabilities_gw: Gateway, team: tuple[str, str]
) -> None:
    client = capabilities_gw.client(team[1])
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="fake", input="hi", background=True, store=False)
    assert refused.value.body["param"] == "store"  # type: ignore[index]


def _text(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def _streamed(client: openai.OpenAI, asked: str) -> Any:
    return client.responses.create(model="fake", input=asked, background=True, stream=True)


def test_a_streamed_background_response_outlives_its_client_and_is_streamed_again(
    capabilities_gw: Gateway, gateway: Gateway, team: tuple[str, str], redis_server: RedisServer
) -> None:
    """`background` with `stream`: the events stream as they are made; the client hanging up does
    not stop the walk; any gateway streams the events again from where the client left off, while
    the walk goes on and after it ended (the SDK's own reconnecting stream included)."""
    name, key = team
    client = capabilities_gw.client(key)
    first: list[Any] = []
    with _streamed(client, "Write #chunks=12 #delay=0.25 #stop") as stream:
        for event in stream:
            first.append(event)
            if event.type == "response.output_text.delta":
                break  # the client hangs up after the first words
    assert [e.type for e in first[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    made = first[0].response
    assert made.status == "queued" and made.background is True
    assert [e.sequence_number for e in first] == list(range(len(first)))
    assert not problems("ResponseQueuedEvent", first[1].model_dump(mode="json"))
    assert client.responses.retrieve(made.id).status == "in_progress"  # the walk goes on
    # picked up on another gateway, from just after the last event seen, while it still runs
    other = gateway.client(key)
    last = first[-1].sequence_number
    with other.responses.with_streaming_response.retrieve(
        made.id, stream=True, starting_after=last
    ) as raw:  # as a proxy in between must not buffer it
        assert raw.headers["x-accel-buffering"] == "no"
    rest = list(other.responses.retrieve(made.id, stream=True, starting_after=last))
    assert [e.sequence_number for e in rest] == list(range(last + 1, last + 1 + len(rest)))
    assert rest[-1].type == "response.completed"
    assert _text(first) + _text(rest) == "tok " * 12 == rest[-1].response.output_text
    assert rest[-1].response.id == made.id
    # stored before its last event went out
    assert other.responses.retrieve(made.id).status == "completed"
    # after the end: every event again, from the start; and through the SDK's reconnecting helper
    again = list(client.responses.retrieve(made.id, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in first + rest]
    with client.responses.stream(response_id=made.id, starting_after=last) as resumed:
        assert resumed.get_final_response().output_text == "tok " * 12
    wait_until(lambda: reservations(redis_server.client(), name) == IDLE, 3, "settled")


def test_a_streamed_background_response_is_cancelled_and_its_stream_ends(
    capabilities_gw: Gateway, team: tuple[str, str], redis_server: RedisServer, upstream: str
) -> None:
    name, key = team
    client = capabilities_gw.client(key)
    before = upstream_stats(upstream)["cancelled"]
    seen: list[Any] = []
    with _streamed(client, "Write at length #chunks=60 #delay=0.2") as stream:
        for event in stream:
            seen.append(event)
            if event.type == "response.output_text.delta" and _text(seen) == "tok ":
                assert client.responses.cancel(seen[0].response.id).status == "cancelled"
    # the walk stopped within a heartbeat and the stream ended with it, well before 60 words
    assert "response.completed" not in {e.type for e in seen}
    assert len(_text(seen).split()) < 30
    wait_until(lambda: reservations(redis_server.client(), name) == IDLE, 6, "the walk stopped")
    wait_until(lambda: upstream_stats(upstream)["cancelled"] == before + 1, 3, "upstream told")
    assert client.responses.retrieve(seen[0].response.id).status == "cancelled"


@pytest.mark.parametrize(
    ("model", "asked", "code"),
    [
        ("fake", "hi #status=400", "server_error"),  # the upstream's refusal, without a code
        ("no-such-model", "hi", "model_not_found"),  # the gateway's, once the walk starts
    ],
)
def test_a_refused_streamed_background_response_ends_failed_with_its_code(
    capabilities_gw: Gateway, team: tuple[str, str], model: str, asked: str, code: str
) -> None:
    client = capabilities_gw.client(team[1])
    made = client.responses.create(model=model, input=asked, background=True, stream=True)
    events = list(made)
    assert [e.type for e in events] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    stored = client.responses.retrieve(events[0].response.id)
    assert stored.status == events[-1].response.status == "failed"
    # the refusal's own code in the error event, the last event's response and the stored one,
    # as a background response that is not streamed stores it
    assert events[3].code == events[-1].response.error.code == stored.error.code == code


def test_only_a_streamed_background_responses_events_are_streamed_again(
    capabilities_gw: Gateway, team: tuple[str, str], sql: Any
) -> None:
    client = capabilities_gw.client(team[1])
    plain = client.responses.create(model="fake", input="hi #chunks=1 #stop")
    polled = client.responses.create(model="fake", input="hi #chunks=1 #stop", background=True)
    for made in (plain, polled):
        with pytest.raises(openai.BadRequestError) as refused:
            list(client.responses.retrieve(made.id, stream=True))
        assert refused.value.body["param"] == "stream"  # type: ignore[index]
    streamed = _streamed(client, "hi #chunks=1 #stop")
    made_id = next(iter(streamed)).response.id
    list(streamed)
    # another team's response is missing, as is one deleted (its events with it)
    other_name = "bg-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, other_name)
    stranger = capabilities_gw.client(keys.create_key(sql, other_name).key)
    with pytest.raises(openai.NotFoundError):
        list(stranger.responses.retrieve(made_id, stream=True))
    client.responses.delete(made_id)
    with pytest.raises(openai.NotFoundError):
        list(client.responses.retrieve(made_id, stream=True))


def test_a_response_whose_gateway_stopped_reads_as_failed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Unfinished, with no gateway saying it is alive (its heartbeat lapsed): failed, and stored
    so; one whose gateway still beats stays as it is."""
    sql = get_engine(f"sqlite:///{tmp_path}/responses.db")
    upgrade(sql)
    store = ResponseStore(sql, 1)

    async def run() -> None:
        redis = aioredis.Redis.from_url(redis_server.url)
        background = Background(cast(Any, None), store, redis)  # no walk in this test
        for rid, beating in (("resp_stopped", False), ("resp_running", True)):
            response = {"id": rid, "created_at": 1, "status": "in_progress", "error": None}
            await store.save("t", response, [])
            if beating:
                await redis.set(f"ty:{{t}}:response:{rid}:alive", 1, ex=10)
        stopped = await background.current("t", await store.get("t", "resp_stopped"))
        assert stopped["status"] == "failed" and stopped["error"]["code"] == "server_error"
        assert (await store.get("t", "resp_stopped")).response["status"] == "failed"
        running = await background.current("t", await store.get("t", "resp_running"))
        assert running["status"] == "in_progress"
        await redis.aclose()

    asyncio.run(run())


def test_the_event_log_ends_a_stream_whose_gateway_stopped(redis_server: RedisServer) -> None:
    """A follower reads the events after `starting_after`, waits for more while the walk is
    alive, and stops at the end mark; where the walk's gateway stopped without one (no
    heartbeat), it stops once nothing more is there, never waiting forever."""
    events = b"".join(
        f'event: e\ndata: {{"type":"e","sequence_number":{i}}}\n\n'.encode() for i in range(4)
    )

    async def run() -> None:
        redis = aioredis.Redis.from_url(redis_server.url)
        log = EventLog(redis)
        beating = True

        async def alive() -> bool:
            return beating

        async def read(after: int | None) -> list[bytes]:
            return [e async for e in log.follow("t", "resp_log", after, alive)]

        await log.append("t", "resp_log", events[: events.index(b"event: e", 10)])
        follower = asyncio.ensure_future(read(1))
        await asyncio.sleep(0.7)  # past one blocking read: still waiting for more
        assert not follower.done()
        await log.append("t", "resp_log", events[events.index(b"event: e", 10) :])
        beating = False  # the gateway stopped without an end mark
        got = await asyncio.wait_for(follower, 3)
        assert [b'"sequence_number":2' in e for e in got] == [True, False]
        assert all(e.endswith(b"\n\n") for e in got) and len(got) == 2
        assert len(await read(None)) == 4 and await log.kept("t", "resp_log")
        assert 0 < await redis.ttl("ty:{t}:response:resp_log:events") <= KEEP_S
        beating = True
        await log.end("t", "resp_log")
        assert len(await asyncio.wait_for(read(None), 1)) == 4  # the end mark: no waiting
        await log.delete("t", "resp_log")
        assert not await log.kept("t", "resp_log")
        await redis.aclose()

    asyncio.run(run())


def test_the_teams_receiver_gets_openais_webhook_events(
    capabilities_gw: Gateway, team: tuple[str, str], sql: Any
) -> None:
    """Where the operator gave the team a webhook_url, a background response's end reaches it as
    OpenAI's `response.*` event, signed with the team's webhook secret: the `openai` SDK's own
    `webhooks.unwrap` checks and reads it. A team without a receiver records nothing."""
    name, key = team
    client = capabilities_gw.client(key)
    with receiving() as received:
        teams.update_team(sql, name, webhook_url=f"http://127.0.0.1:{received.port}/hooks")
        done = client.responses.create(model="fake", input="hi #chunks=1 #stop", background=True)
        slow = client.responses.create(
            model="fake", input="Write at length #chunks=60 #delay=0.2", background=True
        )
        client.responses.cancel(slow.id)
        wait_until(lambda: len(received) == 2, 10, "two events")
    secret = team_secret(sql, name)
    reader = openai.OpenAI(api_key="unused", webhook_secret=secret)
    events = {}
    for path, body, headers in received:
        assert path == "/hooks"
        event = reader.webhooks.unwrap(body, headers)
        events[event.data.id] = event
        assert headers["webhook-id"] == event.id and event.id.startswith("evt_")
    assert events[done.id].type == "response.completed"
    assert events[slow.id].type == "response.cancelled"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        reader.webhooks.unwrap(received[0][1] + b" ", received[0][2])
    with Session(sql) as session:
        kept = session.exec(select(TeamEvent).where(TeamEvent.team == name)).all()
    assert len(kept) == 2 and all(e.delivered_at is not None for e in kept)
    # without a receiver, nothing is kept to send
    teams.update_team(sql, name, webhook_url="")
    quiet = client.responses.create(model="fake", input="hi #chunks=1 #stop", background=True)
    assert _ended(client, quiet.id).status == "completed"
    with Session(sql) as session:
        assert len(session.exec(select(TeamEvent).where(TeamEvent.team == name)).all()) == 2


def test_a_background_response_without_redis_is_a_503_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    """Redis carries the walk's heartbeat: without it a background response is refused (503,
    retry shortly) before anything is stored or started, never left queued forever."""
    sql = get_engine(f"sqlite:///{tmp_path}/responses.db")
    upgrade(sql)
    store = ResponseStore(sql, 1)
    asked = {"model": "m", "input": "hi", "background": True}
    turn = begin(msgspec.convert(asked, CreateResponse), asked, [])

    async def run() -> None:
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}")  # nothing listens
        background = Background(cast(Any, None), store, redis)  # no walk may start
        with pytest.raises(GatewayError) as refused:
            await background.start(TeamPolicy(team="t"), turn, "interactive", "req-1", _unused)
        assert (refused.value.status, refused.value.retry_after) == (503, 1)
        assert await store.get("t", turn.id) is None
        await redis.aclose()

    asyncio.run(run())


async def _unused(*_: object) -> None:
    raise AssertionError("nothing is kept")
