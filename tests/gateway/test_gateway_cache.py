"""The response cache: a deterministic request asked again is answered from Redis, without the
upstream and without charge; entries are each team's own, sampled requests are never cached, a
stream is replayed as events, and Cache-Control steers it per request."""

import time
import uuid
from typing import Any

import openai
import sqlmodel

from tests.gateway.conftest import MODEL, upstream_stats, wait_until
from tokenyard.billing.models import UsageRecord


def _calls(upstream: str, team: str) -> int:
    """Requests the upstream received for the team."""
    return int(upstream_stats(upstream)["tenants"].get(team, {}).get("requests", 0))


def _ask(client: openai.OpenAI, **fields: Any) -> Any:
    """A raw chat reply (headers and the parsed completion)."""
    return client.chat.completions.with_raw_response.create(**fields)


def _record(sql: Any, request_id: str) -> UsageRecord:
    def stored() -> UsageRecord | None:
        with sqlmodel.Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.request_id == request_id)
            return session.exec(query).first()

    wait_until(lambda: stored() is not None, 10, "the usage record")
    found = stored()
    assert found is not None
    return found


def test_a_deterministic_request_is_answered_again_from_the_cache(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    gateway = start_gateway(gateway_cache_ttl_s="60")
    name, key = team()
    client = gateway.client(key)
    words = f"cache me {uuid.uuid4().hex} #chunks=3"
    ask = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 8}
    first = _ask(client, **ask, temperature=0)
    second = _ask(client, **ask, temperature=0, user="someone else")  # a label, not a new ask
    assert (first.headers["x-tokenyard-cache"], second.headers["x-tokenyard-cache"]) == (
        "miss",
        "hit",
    )
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert second.parse().usage == first.parse().usage  # the answer as it was given
    assert _calls(upstream, name) == 1
    # the hit is recorded: nothing charged, nothing counted against the team's tokens
    hit = _record(sql, second.headers["x-request-id"])
    assert hit.cache_hit and hit.status == 200 and hit.model_served == MODEL
    assert (hit.cost_usd, hit.prompt_tokens, hit.completion_tokens) == (0.0, 0, 0)
    assert not _record(sql, first.headers["x-request-id"]).cache_hit

    # a different length cap, or another team's same ask, is another answer
    assert _ask(client, **{**ask, "max_tokens": 9}, temperature=0).headers["x-tokenyard-cache"] == (
        "miss"
    )
    other_name, other_key = team()
    other = _ask(gateway.client(other_key), **ask, temperature=0)
    assert other.headers["x-tokenyard-cache"] == "miss" and _calls(upstream, other_name) == 1

    # a fixed seed is deterministic too; sampling is never cached
    assert _ask(client, **ask, seed=7).headers["x-tokenyard-cache"] == "miss"
    assert _ask(client, **ask, seed=7).headers["x-tokenyard-cache"] == "hit"
    before = _calls(upstream, name)
    for _ in range(2):
        assert "x-tokenyard-cache" not in _ask(client, **ask, temperature=0.7).headers
    assert _calls(upstream, name) == before + 2

    # Cache-Control: no-cache asks the upstream again, no-store bypasses the cache
    fresh = _ask(client, **ask, temperature=0, extra_headers={"cache-control": "no-cache"})
    skipped = _ask(client, **ask, temperature=0, extra_headers={"cache-control": "no-store"})
    assert fresh.headers["x-tokenyard-cache"] == "refresh"
    assert "x-tokenyard-cache" not in skipped.headers
    assert _calls(upstream, name) == before + 4


def test_entries_live_as_long_as_the_setting_says(
    start_gateway: Any, team: Any, upstream: str
) -> None:
    gateway, other = start_gateway(gateway_cache_ttl_s="0.5"), start_gateway()
    name, key = team()
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"brief {uuid.uuid4().hex}"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    client = gateway.client(key)
    assert _ask(client, **ask).headers["x-tokenyard-cache"] == "miss"
    assert _ask(client, **ask).headers["x-tokenyard-cache"] == "hit"
    assert "x-tokenyard-cache" not in _ask(other.client(key), **ask).headers  # off by default
    time.sleep(0.6)
    assert _ask(client, **ask).headers["x-tokenyard-cache"] == "miss"
    assert _calls(upstream, name) == 3

    # a team's own time wins over the platform's: 0 keeps nothing; set, it caches where the
    # platform does not
    _, never = team(cache_ttl_s=0.0)
    assert "x-tokenyard-cache" not in _ask(gateway.client(never), **ask).headers
    _, own = team(cache_ttl_s=60.0)
    answers = [_ask(other.client(own), **ask).headers["x-tokenyard-cache"] for _ in range(2)]
    assert answers == ["miss", "hit"]


def _stream(client: openai.OpenAI, **fields: Any) -> tuple[dict[str, str], list[Any]]:
    """A streamed chat reply: its headers and its chunks."""
    with client.chat.completions.with_streaming_response.create(stream=True, **fields) as raw:
        return dict(raw.headers), list(raw.parse())


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_stream_is_replayed_from_the_cache(
    start_gateway: Any, team: Any, upstream: str, sql: Any
) -> None:
    gateway = start_gateway(gateway_cache_ttl_s="60")
    name, key = team()
    client = gateway.client(key)
    words = f"stream me {uuid.uuid4().hex} #chunks=4"
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 8,
        "temperature": 0,
    }
    first_headers, first = _stream(client, **ask, stream_options={"include_usage": True})
    headers, again = _stream(client, **ask, stream_options={"include_usage": True})
    assert (first_headers["x-tokenyard-cache"], headers["x-tokenyard-cache"]) == ("miss", "hit")
    assert _calls(upstream, name) == 1
    assert len(again) == len(first) >= 4 and _text(again) == _text(first)
    assert again[-1].usage == first[-1].usage and again[-1].usage is not None
    assert [c.choices[0].finish_reason for c in again if c.choices][-1] == "length"
    hit = _record(sql, headers["x-request-id"])
    assert hit.cache_hit and hit.stream and hit.status == 200 and hit.finish_reason == "length"
    assert (hit.cost_usd, hit.prompt_tokens, hit.completion_tokens) == (0.0, 0, 0)

    # the client's own include_usage still decides whether the usage chunk is relayed
    _, plain = _stream(client, **ask)
    assert all(c.usage is None for c in plain) and _text(plain) == _text(first)
    # the same ask unstreamed is another entry; the stream's entry serves streams only
    reply = _ask(client, **ask)
    assert reply.headers["x-tokenyard-cache"] == "miss"
    assert reply.parse().choices[0].message.content == _text(first)
    assert _calls(upstream, name) == 2

    # a stream the client left before its end is not kept
    cut = {**ask, "messages": [{"role": "user", "content": f"{words} #delay=0.05"}]}
    with client.chat.completions.with_streaming_response.create(stream=True, **cut) as raw:
        assert raw.headers["x-tokenyard-cache"] == "miss"
        next(iter(raw.parse()))
    wait_until(lambda: _calls(upstream, name) == 3, 10, "the cut stream upstream")
    _, whole = _stream(client, **cut)
    assert _calls(upstream, name) == 4 and len(_text(whole)) > 0


def test_a_stream_over_the_size_limit_is_not_kept(
    start_gateway: Any, team: Any, upstream: str
) -> None:
    gateway = start_gateway(gateway_cache_ttl_s="60", gateway_cache_max_bytes="2000")
    name, key = team()
    client = gateway.client(key)
    for chunks, calls in ((2, 1), (2, 1), (30, 2), (30, 3)):
        words = f"sized {name} #chunks={chunks}"
        ask = {"messages": [{"role": "user", "content": words}], "max_tokens": 40}
        _stream(client, model=MODEL, temperature=0, **ask)
        assert _calls(upstream, name) == calls
