"""In-process checks of the pieces with arithmetic in them: estimates, pages, chunked decoding."""

import asyncio
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from tokenyard.backends.base import ModelInfo
from tokenyard.backends.http import HttpPool, _dechunk, header_line
from tokenyard.backends.registry import Backends
from tokenyard.core.errors import GatewayError
from tokenyard.gateway import metrics
from tokenyard.gateway.dispatch import Dispatch, Saturation
from tokenyard.gateway.isolation import cache_salt
from tokenyard.gateway.response_cache import ResponseCache, mode_of
from tokenyard.gateway.sizing import MAX_PROMPT_OVERHEAD, PromptOverhead, kv_pages
from tokenyard.gateway.streaming import reply_decoder
from tokenyard.gateway.validation import Kind, estimate_prompt_sizes, parse
from tokenyard.router.policy import Route
from tokenyard.tenancy.policy import TeamPolicy


def test_estimates_and_pages() -> None:
    chat = parse(b'{"model": "m", "messages": [{"role": "user", "content": "12345678"}]}', "chat")
    assert chat.prompt_tokens == 2 + 5 + 3  # 8 bytes / 4, one message, the reply's opening
    assert estimate_prompt_sizes([1, 2, 3, 4, 5]) == [5]  # token ids are counted exactly
    assert estimate_prompt_sizes(["abcd", "abcdefgh", [7, 8, 9]]) == [1, 2, 3]  # each one runs
    listed = parse(b'{"model": "m", "prompt": ["abcd", "abcdefgh"], "n": 3}', "completion")
    assert (listed.prompt_tokens, listed.choices) == (3, 6)
    assert kv_pages(10, 22, 1, 16) == 2
    assert kv_pages(10, 23, 2, 16) == 6  # each choice holds its own blocks
    assert kv_pages(10, 23, 1, 0) == 0  # not a paged engine
    # a ranking reads each document with the query (a cross-encoder's cost), and generates nothing
    ranked = parse(
        b'{"model": "m", "query": "abcd", "documents": ["abcdefgh", {"text": "ab"}]}', "rerank"
    )
    assert (ranked.prompt_sizes, ranked.max_tokens, ranked.stream) == ([3, 2], 0, False)


def test_usage_of_a_server_that_reports_only_its_total() -> None:
    """Jina's and vLLM's rerank replies count what was read as total_tokens alone."""
    got = reply_decoder.decode(b'{"results": [], "usage": {"total_tokens": 42}}')
    assert got.usage is not None and (got.usage.prompt, got.usage.completion) == (42, 0)
    chat = b'{"usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}'
    assert reply_decoder.decode(chat).usage.prompt == 5  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "kind", "param"),
    [
        (b'{"model": "m", "messages": [], "max_tokens": 0}', "chat", "messages"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}', "chat", "max_tokens"),
        (
            b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "9"}',
            "chat",
            "max_tokens",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "chat", "model"),
        (b'{"model": "m", "prompt": [{"x": 1}]}', "completion", "prompt"),
        (b'{"model": "m"}', "completion", "prompt"),
        (b'{"model": "m", "prompt": "x", "n": 99}', "completion", "n"),
        (b'{"model": "m", "prompt": "x", "tier": "vip"}', "completion", "tier"),
        (b'{"model": "m", "prompt": []}', "completion", "prompt"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "chat", "messages"),
        (b'{"model": "m", "messages": [{"role": "user"}]}', "chat", "messages"),
        (
            b'{"model": "m", "messages": [{"role": "assistant", "content": null}]}',
            "chat",
            "messages",
        ),
        (b'{"model": "m", "prompt": [[1], "x", [[2]]]}', "completion", "prompt"),
        (b'{"model": "m", "prompt": "x", "request_id": "a\\r\\nb"}', "completion", "request_id"),
        # text the usage record keeps: PostgreSQL could never store a NUL (an unbilled request)
        (b'{"model": "m", "prompt": "x", "user": "a\\u0000b"}', "completion", "user"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
            b'"metadata": {"k": "\\u0000"}}',
            "chat",
            "metadata",
        ),
        (b'{"model": "m", "input": "x", "user": "\\u0000"}', "embedding", "user"),
        (b'{"model": "m", "query": "", "documents": ["x"]}', "rerank", "query"),
        (b'{"model": "m", "query": "q", "documents": [null]}', "rerank", "documents"),
        (b'{"model": "m", "query": "q", "documents": ["x"], "top_n": 0}', "rerank", "top_n"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": [{"text": 5}]}]}',
            "chat",
            "messages",
        ),
    ],
)
def test_bad_requests_name_the_param(raw: bytes, kind: str, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        parse(raw, kind)  # type: ignore[arg-type]
    assert err.value.status == 400
    assert err.value.param == param


def test_a_nul_in_recorded_text_is_refused_in_words() -> None:
    with pytest.raises(GatewayError) as err:
        parse(b'{"model": "m", "prompt": "x", "safety_identifier": "\\u0000"}', "completion")
    assert err.value.message == "safety_identifier must not contain NUL characters"


def test_dechunk_across_reads() -> None:
    wire = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    out, rest, done = b"", b"", False
    for i in range(0, len(wire), 3):  # arbitrary read boundaries
        pieces, rest, done = _dechunk(rest + wire[i : i + 3])
        out += pieces
    assert (out, rest, done) == (b"hello world", b"", True)


def test_prompt_overhead_is_learned_and_never_negative() -> None:
    overhead = PromptOverhead()
    for _ in range(60):  # the template adds ~20 tokens the byte estimate cannot see
        overhead.observe("m", "a", estimate=11, actual=32)
    assert overhead.extra("m", "a") == 21
    for _ in range(60):  # an estimate above the truth adds nothing
        overhead.observe("m", "a", estimate=40, actual=30)
    assert overhead.extra("m", "a") == 0


def test_prompt_overhead_is_per_model_and_team_and_bounded() -> None:
    overhead = PromptOverhead()
    for _ in range(100):  # text that tokenizes far denser than the byte estimate
        overhead.observe("m", "dense", estimate=10, actual=50_000)
    assert overhead.extra("m", "dense") == MAX_PROMPT_OVERHEAD
    assert overhead.extra("m", "other") == 0  # another team's estimate never moves
    assert overhead.extra("other-model", "dense") == 0  # nor another model's template


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-request-id", "a\r\nx-tenant: other"), ("x-a", "b\nc"), ("x-a", "nul\x00"), ("x a", "b")],
)
def test_header_lines_refuse_what_would_break_the_header_block(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        header_line(name, value)


async def test_the_pool_writes_nothing_for_a_bad_header() -> None:
    """The check runs before the connection is even opened: a listener sees no connection."""
    accepted = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = HttpPool(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(ValueError):
        await pool.request("POST", "/v1/x", b"{}", {"x-request-id": "a\r\n\r\nGET / HTTP/1.1"})
    await asyncio.sleep(0.05)
    assert accepted == []
    server.close()
    await pool.aclose()


def test_an_assistant_turn_that_calls_a_tool_needs_no_content() -> None:
    raw = (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", '
        b'"content": null, "tool_calls": [{"id": "c", "type": "function"}]}, {"role": "tool", '
        b'"content": "42", "tool_call_id": "c"}]}'
    )
    assert parse(raw, "chat").prompt_tokens > 0


async def test_a_hung_shutdown_step_is_given_up_and_named(caplog: pytest.LogCaptureFixture) -> None:
    from tokenyard.app import _bounded

    await _bounded("the stuck step", asyncio.Event().wait(), 0.05)  # never set: would hang
    assert "shutdown: the stuck step did not finish within 0 s" in caplog.text
    await _bounded("a quick step", asyncio.sleep(0), 5.0)
    assert "a quick step" not in caplog.text


def test_saturation_by_queue_and_kv_usage_batch_gives_way_first() -> None:
    sat = Saturation(max_waiting=4, max_kv_usage=0.9)
    info = ModelInfo(name="tiny", ready=True, waiting=2, kv_usage=0.5)
    assert not sat.saturated(info, "interactive")
    assert sat.saturated(info, "batch")  # batch overflows at half the queue
    info.waiting = 4
    assert sat.saturated(info, "interactive")
    info.waiting, info.kv_usage = 0, 0.95
    assert sat.saturated(info, "interactive")
    assert not Saturation().saturated(info, "interactive")  # both tests off


def _overflows(model: str, why: str) -> float:
    return metrics.OVERFLOWS.labels(model, why)._value.get()


def test_dispatch_takes_the_first_usable_candidate_and_counts_what_it_skips() -> None:
    infos = {
        "busy": ModelInfo(name="busy", ready=True, waiting=9),
        "open": ModelInfo(name="open", ready=True, circuit="open"),
        "free": ModelInfo(name="free", ready=True),
    }
    upstreams: Any = {name: SimpleNamespace(info=info) for name, info in infos.items()}
    dispatch = Dispatch(Backends(upstreams), Saturation(max_waiting=4))
    route = Route(asked="busy", candidates=("busy", "missing", "open", "free"))
    before = _overflows("busy", "saturated"), _overflows("open", "down")
    assert dispatch.first_usable(route, "interactive").info.name == "free"
    assert (_overflows("busy", "saturated"), _overflows("open", "down")) == (
        before[0] + 1,
        before[1] + 1,
    )
    assert dispatch.next_open(route, "interactive", 4) is None  # past the last candidate
    infos["free"].waiting = 5  # every candidate saturated or down: a 503 that says which
    with pytest.raises(GatewayError) as saturated:
        dispatch.first_usable(route, "interactive")
    assert saturated.value.code == "upstream_saturated" and saturated.value.retry_after == 1
    assert "(5 requests queued)" in saturated.value.message
    for info in infos.values():
        info.ready = False
    with pytest.raises(GatewayError) as down:
        dispatch.first_usable(route, "interactive")
    assert down.value.code == "model_not_ready"


def test_which_requests_share_a_response_cache_entry() -> None:
    cache = ResponseCache(None, ttl_s=60, max_bytes=1)  # type: ignore[arg-type]
    team = TeamPolicy(team="a")

    def place(kind: Kind = "chat", policy: TeamPolicy = team, **fields: Any) -> str | None:
        asked: dict[str, Any] = {"model": "m", **fields}
        if kind == "chat":
            asked = {"messages": [{"role": "user", "content": "hi"}], **asked}
        found = cache.lookup(kind, policy, parse(msgspec.json.encode(asked), kind), "use")
        return found.key if found else None

    greedy = place(temperature=0, max_tokens=5)
    assert greedy is not None and greedy.startswith("ty:{a}:cache:")
    # the same ask with the length cap under its newer name, and a label
    assert place(max_completion_tokens=5, temperature=0, user="u") == greedy
    assert place(temperature=0, max_tokens=6) != greedy
    assert place("chat", TeamPolicy(team="b"), temperature=0, max_tokens=5) != greedy
    # sampling (the default too), or a team whose time is 0: not cached
    assert place(temperature=0.5) is None and place() is None
    assert place(seed=1) is not None
    # a stream is kept apart from the same ask unstreamed (events, not a JSON reply)
    streamed = place(temperature=0, max_tokens=5, stream=True)
    assert streamed is not None and streamed != greedy
    assert place(temperature=0, max_tokens=5, stream=True, stream_options={}) == streamed
    assert place("chat", TeamPolicy(team="a", cache_ttl_s=0), temperature=0) is None
    assert place("embedding", input="text") is not None
    # an image or speech is sampled however it is asked for: never kept
    assert place("image", prompt="a fox", temperature=0) is None
    assert place("speech", input="hello", voice="alloy") is None
    # a client's cache_salt keeps its answers apart, as it keeps its prompts apart in the engine
    assert place(temperature=0, max_tokens=5, cache_salt="alice") not in (greedy, None)
    # the end user a request names: safety_identifier over user, bounded; embeddings too
    for kind, asked, named in (
        ("chat", {"user": "u", "safety_identifier": "s"}, "s"),
        ("chat", {"user": "u" * 200}, "u" * 128),
        ("completion", {"prompt": "p", "user": "u"}, "u"),
        ("embedding", {"input": "i", "user": "e"}, "e"),
        ("chat", {}, None),
    ):
        if kind == "chat":
            asked = {"messages": [{"role": "user", "content": "hi"}], **asked}
        assert parse(msgspec.json.encode({"model": "m", **asked}), kind).end_user == named
    assert (mode_of(None), mode_of("No-Cache, max-age=0"), mode_of("no-store")) == (
        "use",
        "refresh",
        "skip",
    )


def test_prefix_cache_salts_are_per_team_and_namespace_the_clients() -> None:
    """Each team its own salt; a client's salt narrows it within the team and never equals another
    team's; the shared scope salts only requests that ask; a bad salt is a 400 naming it."""
    team_a, team_b = cache_salt("team", "a", None), cache_salt("team", "b", None)
    assert team_a and team_b and team_a != team_b
    assert cache_salt("team", "a", None) == team_a  # stable: a team's requests share
    alice_a, alice_b = cache_salt("team", "a", "alice"), cache_salt("shared", "b", "alice")
    assert len({team_a, alice_a, alice_b}) == 3
    assert cache_salt("shared", "a", "alice") == alice_a  # the scope only decides the unsalted
    assert cache_salt("shared", "a", None) is None
    for bad in ("", "x" * 257, 7, ["a"]):
        with pytest.raises(GatewayError) as err:
            cache_salt("team", "a", bad)
        assert err.value.param == "cache_salt" and err.value.status == 400
