"""Every quota through a real Redis and the official SDK: refusals name the limit and say when to
retry, reservations settle to actual usage, and nothing stays reserved afterwards."""

import contextlib
import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import MODEL, day_tokens, reservations, upstream_stats, wait_until
from tokenyard.gateway.quotas import TeamKeys, day_number, month_of
from tokenyard.gateway.ratelimit_headers import duration
from tokenyard.tenancy import end_users, keys


def chat(n_words: int = 3, chunks: int = 4, delay: float = 0.0) -> list[dict[str, str]]:
    words = " ".join(["w"] * (n_words - 1))
    directive = f"#chunks={chunks}" + (f" #delay={delay}" if delay else "")
    return [{"role": "user", "content": f"{words} {directive}"}]


def refused(call: Any) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        call()
    return err.value


def test_requests_per_minute(gateway: Any, team: Any) -> None:
    _, key = team(rpm=2)
    client = gateway.client(key)
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 429
    assert err.code == "requests_per_minute"
    assert err.body["type"] == "rate_limit_error"
    # 2/minute refills one request every 30 s
    assert 28 <= int(err.response.headers["retry-after"]) <= 30


def test_tokens_per_minute_reserves_max_tokens_and_refunds(
    gateway: Any, team: Any, redis_server: Any
) -> None:
    name, key = team(tpm=200)
    client = gateway.client(key)
    messages = chat(chunks=5)  # "w w #chunks=5": reserves 4 + 5 + 3 + 120 = 132, uses 3 + 5
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120)
    # admitted only because the unused 112 tokens came back
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120)
    assert day_tokens(redis_server.client(), name) == 16  # settled to the upstream's counts
    # a stream holding 134 leaves no room for another 132 while it runs
    stream = client.chat.completions.create(
        model=MODEL, messages=chat(chunks=5, delay=0.2), max_tokens=120, stream=True
    )
    next(iter(stream))
    err = refused(
        lambda: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120)
    )
    assert err.status_code == 429 and err.code == "tokens_per_minute"
    # level = 200 - 16 - 134 = 50 (plus a little refill); needs 132: 82 / 200 min = 24.6 s
    assert 23 <= int(err.response.headers["retry-after"]) <= 25
    stream.close()
    err = refused(
        lambda: client.chat.completions.create(model=MODEL, messages=messages, max_tokens=300)
    )
    assert err.code == "tokens_per_minute"  # larger than the whole limit: never fits


def test_tokens_per_day_retry_after_is_midnight(gateway: Any, team: Any) -> None:
    _, key = team(tokens_per_day=150)
    client = gateway.client(key)
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=100)
    err = refused(
        lambda: client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=140)
    )
    assert err.status_code == 429 and err.code == "tokens_per_day"
    to_midnight = 86400 - int(time.time()) % 86400
    assert abs(int(err.response.headers["retry-after"]) - to_midnight) <= 2


def test_usd_per_day_counter_refuses_once_spent(gateway: Any, team: Any, redis_server: Any) -> None:
    """Reserve reads the day's spend (charged by settle from billing's prices; the whole path is
    tests/billing's): over the budget, refused."""
    name, key = team(usd_per_day=1.0)
    client = gateway.client(key)
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)
    redis_server.client().incrby(TeamKeys(name).day_usd(day_number()), 1_250_000)  # $1.25
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    # OpenAI's code and type for a spent budget (clients stop retrying); the limit in a header
    assert err.status_code == 429 and err.code == "insufficient_quota"
    assert err.body["type"] == "insufficient_quota" and "usd_per_day" in err.message
    assert err.response.headers["x-tokenyard-limit"] == "usd_per_day"


def test_usd_per_month_refuses_until_the_month_ends(
    gateway: Any, team: Any, redis_server: Any, sql: Any
) -> None:
    """A team's (and a key's own) dollars per calendar month: spent, refused as a spent budget
    until the 1st of the next month (UTC), the message naming which."""
    name, key = team(usd_per_month=10.0)
    client = gateway.client(key)
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)
    month, month_end = month_of()
    counters, names = redis_server.client(), TeamKeys(name)
    counters.incrby(names.month_usd(month), 10_000_000)  # $10
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 429 and err.code == "insufficient_quota"
    assert "usd_per_month" in err.message and "dollars per month" in err.message
    assert err.response.headers["x-tokenyard-limit"] == "usd_per_month"
    assert abs(int(err.response.headers["retry-after"]) - (month_end - time.time())) <= 2
    # a key's own monthly budget, within a team that has none
    other, _ = team()
    own = keys.create_key(sql, other, limits={"usd_per_month": 1.0})
    mine = gateway.client(own.key)
    mine.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)
    counters.incrby(TeamKeys(other).key_month_usd(own.prefix, month), 1_000_000)
    err = refused(lambda: mine.chat.completions.create(model=MODEL, messages=chat()))
    assert err.code == "insufficient_quota" and f"key {own.prefix}" in err.message
    assert err.response.headers["x-tokenyard-limit"] == "key_usd_per_month"


def test_months_end_on_the_first_of_the_next_utc_month() -> None:
    assert month_of(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        "2026-12",
        int(datetime(2027, 1, 1, tzinfo=UTC).timestamp()),
    )
    assert month_of(datetime(2026, 2, 1, tzinfo=UTC))[1] == int(
        datetime(2026, 3, 1, tzinfo=UTC).timestamp()
    )


def test_concurrency_and_kv_pages(gateway: Any, team: Any, redis_server: Any) -> None:
    r = redis_server.client()
    name, key = team(concurrency=2)
    client = gateway.client(key)
    slow = chat(chunks=10, delay=0.1)
    streams = [
        client.chat.completions.create(model=MODEL, messages=slow, max_tokens=10, stream=True)
        for _ in range(2)
    ]
    for s in streams:
        next(iter(s))
    assert reservations(r, name)["leases"] == 2
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 429 and err.code == "concurrency"
    assert err.response.headers["retry-after"] == "1"
    for s in streams:
        list(s)
    wait_until(lambda: reservations(r, name)["leases"] == 0, 2, "leases released")
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)

    # KV pages: "w w #chunks=10 #delay=0.1" is 25 bytes -> 7 + 5 + 3 = 15 tokens estimated;
    # + max_tokens 17 = 32 = 2 pages of the upstream's 16-token blocks
    name, key = team(kv_pages=5)
    client = gateway.client(key)
    streams = [
        client.chat.completions.create(model=MODEL, messages=slow, max_tokens=17, stream=True)
        for _ in range(2)
    ]
    for s in streams:
        next(iter(s))
    assert reservations(r, name)["pages"] == 4
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=slow, max_tokens=17))
    assert err.status_code == 429 and err.code == "kv_pages"
    # one page still fits: "w w #chunks=4" is 13 bytes -> 12 tokens, + 4 = 16
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=4)
    for s in streams:
        s.close()
    wait_until(lambda: reservations(r, name)["pages"] == 0, 2, "pages released")


def test_platform_caps_keep_room_for_interactive(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(gateway_max_concurrency="3", gateway_max_batch_concurrency="1")
    _, key = team()
    client = gw.client(key)
    slow = chat(chunks=10, delay=0.1)
    batch = client.chat.completions.create(
        model=MODEL, messages=slow, max_tokens=10, stream=True, extra_headers={"x-tier": "batch"}
    )
    next(iter(batch))
    err = refused(
        lambda: client.chat.completions.create(
            model=MODEL, messages=chat(), max_tokens=5, extra_headers={"x-tier": "batch"}
        )
    )
    assert err.status_code == 503 and err.code == "platform_batch_concurrency"
    assert err.response.headers["retry-after"] == "1"
    interactive = [
        client.chat.completions.create(model=MODEL, messages=slow, max_tokens=10, stream=True)
        for _ in range(2)
    ]
    for s in interactive:
        next(iter(s))
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 503 and err.code == "platform_concurrency"
    for s in [batch, *interactive]:
        s.close()


def test_saturated_engine_refuses_batch_first(start_gateway: Any, team: Any, upstream: str) -> None:
    gw = start_gateway(gateway_max_upstream_waiting="4")
    _, key = team()
    client = gw.client(key)
    messages = chat()

    def ask(tier: str) -> int:
        try:
            client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2, extra_headers={"x-tier": tier}
            )
            return 200
        except openai.APIStatusError as err:
            assert err.code == "upstream_saturated"
            assert err.response.headers["retry-after"] == "1"
            return err.status_code

    def queued(n: int) -> None:
        httpx.post(upstream + "/control", json={"waiting": n})
        time.sleep(1.3)  # the gateway polls /load every second

    try:
        queued(2)  # half the limit: batch waits, interactive still goes in
        assert (ask("batch"), ask("interactive")) == (503, 200)
        queued(4)
        assert (ask("batch"), ask("interactive")) == (503, 503)
    finally:
        queued(0)
    assert (ask("batch"), ask("interactive")) == (200, 200)


def test_client_hanging_up_on_a_whole_reply_cancels_it(
    gateway: Any, team: Any, upstream: str, redis_server: Any
) -> None:
    name, key = team(concurrency=1)
    with pytest.raises(httpx.TimeoutException):  # 2 s of "generation"; the client gives up first
        httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": chat(chunks=20, delay=0.1), "max_tokens": 20},
            headers={"authorization": f"Bearer {key}"},
            timeout=0.3,
        )
    hung_up = time.monotonic()
    wait_until(
        lambda: upstream_stats(upstream)["tenants"][name]["cancelled"] == 1, 2, "upstream cancel"
    )
    wait_until(lambda: reservations(redis_server.client(), name)["leases"] == 0, 2, "lease freed")
    assert time.monotonic() - hung_up < 1.0  # at once, not when the reply would have finished
    gateway.client(key).chat.completions.create(model=MODEL, messages=chat(), max_tokens=2)


def test_upstream_failure_mid_stream_settles_usage_so_far(
    gateway: Any, team: Any, redis_server: Any
) -> None:
    name, key = team()
    client = gateway.client(key)
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x #fail=3"}],
            max_tokens=10,
            stream=True,
        ):
            seen.append(chunk)
    assert len(seen) == 3
    r = redis_server.client()
    # no usage chunk came: the estimate (1 + 5 + 3) plus the 3 chunks streamed settle
    wait_until(lambda: day_tokens(r, name) == 14, 2, "mid-stream failure settled")
    assert reservations(r, name)["leases"] == 0


def test_storm_leaves_no_reservation(
    gateway: Any, team: Any, redis_server: Any, upstream: str
) -> None:
    """Bad, refused, failed and cancelled requests at once; afterwards Redis holds nothing for
    the team, and the day's token counter equals exactly the usage that was settled."""
    name, key = team(concurrency=4, kv_pages=40, tpm=100_000)
    r = redis_server.client()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    url = gateway.url + "/v1/chat/completions"

    def body(content: str, **extra: Any) -> dict:
        return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}

    hung_up: list[int] = []  # admitted streams the client abandoned

    def cancel_stream(http: httpx.Client) -> None:
        # hang up after the first event; the upstream must see the disconnect
        with http.stream(
            "POST",
            url,
            json=body("a #chunks=20 #delay=0.05", stream=True, max_tokens=20),
            headers=headers,
        ) as response:
            if response.status_code == 200:
                next(response.iter_bytes())
                hung_up.append(1)

    def timeout_request(http: httpx.Client) -> None:
        # a client that gives up before the first byte (non-streamed)
        with contextlib.suppress(httpx.TimeoutException):
            http.post(url, json=body("a #chunks=5"), headers=headers, timeout=0.001)

    calls = [
        lambda h: h.post(url, content=b"{broken", headers=headers),
        lambda h: h.post(url, json={"model": MODEL}, headers=headers),
        lambda h: h.post(url, json=body("x", max_tokens=99999), headers=headers),
        lambda h: h.post(url, json=body("x #status=400"), headers=headers),
        lambda h: h.post(url, json=body("x #status=500", stream=True), headers=headers),
        lambda h: h.post(url, json=body("x #fail=2", stream=True), headers=headers),
        lambda h: h.post(url, json=body("x #chunks=3", stream=True), headers=headers),
        lambda h: h.post(url, json=body("x #chunks=3"), headers=headers),
        cancel_stream,
        timeout_request,
    ]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        with httpx.Client(timeout=10) as http:
            for j in range(12):
                try:
                    calls[(i + j) % len(calls)](http)
                except Exception as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]

    def drained() -> bool:
        return reservations(r, name) == {"leases": 0, "pages": 0, "platform_leases": 0}

    wait_until(drained, 5, "every reservation released")

    def recorded() -> int:  # billing's records, written from the usage stream
        url = gateway.url + "/v1/usage"
        return httpx.get(url, headers={"authorization": f"Bearer {key}"}).json()["total_tokens"]

    wait_until(lambda: recorded() == day_tokens(r, name) > 0, 5, "records equal to the settled")
    # every abandoned stream was cancelled upstream (the team is new: its counts start at 0)
    assert hung_up, "no stream was admitted to hang up on"
    wait_until(
        lambda: upstream_stats(upstream)["tenants"][name]["cancelled"] == len(hung_up),
        2,
        "every client hang-up to cancel its upstream stream",
    )


def test_rate_limit_headers_as_openai_sends_them(gateway: Any, team: Any) -> None:
    """x-ratelimit-* on answers and refusals alike, from the buckets the reserve script read."""
    _, key = team(rpm=3, tpm=100_000)
    client = gateway.client(key)
    seen = []
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=chat(), max_tokens=5
        )
        seen.append(raw.headers)
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["3"] * 3
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
    assert seen[0]["x-ratelimit-reset-requests"] in ("20s", "19s")  # one of 3/minute: 20 s
    assert seen[0]["x-ratelimit-limit-tokens"] == "100000"
    assert 99_000 < int(seen[0]["x-ratelimit-remaining-tokens"]) < 100_000
    assert seen[0]["x-ratelimit-reset-tokens"].endswith("ms")
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert err.response.headers["x-ratelimit-reset-requests"] in ("1m0s", "59s")
    unlimited = gateway.client(team()[1]).chat.completions.with_raw_response.create(
        model=MODEL, messages=chat(), max_tokens=5
    )
    assert not any(h.startswith("x-ratelimit") for h in unlimited.headers)


def test_a_keys_own_rate_limits_apply_beside_its_teams(gateway: Any, team: Any, sql: Any) -> None:
    """A key with limits of its own is refused at them with their own code, naming the key; the
    team's other keys go on; x-ratelimit-* show the bucket that runs out first."""
    name, team_key = team(rpm=100)
    limited = keys.create_key(sql, name, "tight", limits={"rpm": 2, "tpm": 100_000}).key
    client = gateway.client(limited)
    seen = [
        client.chat.completions.with_raw_response.create(
            model=MODEL, messages=chat(), max_tokens=5
        ).headers
        for _ in range(2)
    ]
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["2", "2"]  # the key's, not 100
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["1", "0"]
    assert seen[0]["x-ratelimit-limit-tokens"] == "100000"  # the team has none: the key's
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 429 and err.code == "key_requests_per_minute"
    assert f"key {limited[:12]}" in err.message
    assert 28 <= int(err.response.headers["retry-after"]) <= 30
    other = gateway.client(team_key).chat.completions.with_raw_response.create(
        model=MODEL, messages=chat(), max_tokens=5
    )
    # the team's: the limited key's two and this one taken from it, the refusal took nothing
    assert other.headers["x-ratelimit-limit-requests"] == "100"
    assert other.headers["x-ratelimit-remaining-requests"] == "97"
    tight = keys.create_key(sql, name, limits={"tpm": 50}).key
    err = refused(  # 50 tokens a minute can never hold prompt + 120
        lambda: gateway.client(tight).chat.completions.create(
            model=MODEL, messages=chat(), max_tokens=120
        )
    )
    assert err.code == "key_tokens_per_minute" and err.response.headers["retry-after"] == "60"


def test_a_keys_own_concurrency_applies_beside_its_teams(
    gateway: Any, team: Any, sql: Any, redis_server: Any
) -> None:
    """A key that may hold one request in flight is refused a second with key_concurrency while
    its team's other keys go on; settling frees it, and the key's lease set empties."""
    name, team_key = team(concurrency=10)
    created = keys.create_key(sql, name, "one-at-a-time", limits={"concurrency": 1})
    client = gateway.client(created.key)
    slow = chat(chunks=10, delay=0.1)
    stream = client.chat.completions.create(model=MODEL, messages=slow, max_tokens=10, stream=True)
    next(iter(stream))
    err = refused(lambda: client.chat.completions.create(model=MODEL, messages=chat()))
    assert err.status_code == 429 and err.code == "key_concurrency"
    assert f"key {created.prefix}" in err.message
    assert err.response.headers["retry-after"] == "1"
    # the team's other key is not held back by it
    gateway.client(team_key).chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)
    r = redis_server.client()
    leases = TeamKeys(name).key_leases(created.prefix)
    assert r.zcard(leases) == 1
    list(stream)
    wait_until(lambda: r.zcard(leases) == 0, 2, "the key's lease released")
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)


def test_each_end_user_is_held_to_the_teams_limits_per_user(
    gateway: Any, team: Any, redis_server: Any
) -> None:
    """A team's per-end-user limits (LiteLLM's customer budgets) hold each user its request names
    (`safety_identifier`, else `user`) apart: one user at its limit is refused with its own code,
    naming it, while another user and requests naming none go on; x-ratelimit-* show the user's
    bucket where it has less left than the team's."""
    name, key = team(rpm=100, user_rpm=2, user_tpm=100_000)
    client = gateway.client(key)

    def ask(max_tokens: int = 5, **who: str) -> Any:
        return client.chat.completions.with_raw_response.create(
            model=MODEL, messages=chat(chunks=5), max_tokens=max_tokens, **who
        )

    seen = [ask(user="alice").headers, ask(safety_identifier="alice").headers]
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["2", "2"]
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["1", "0"]
    assert seen[0]["x-ratelimit-limit-tokens"] == "100000"
    err = refused(lambda: ask(user="alice"))
    assert err.status_code == 429 and err.code == "user_requests_per_minute"
    assert "end user 'alice'" in err.message
    assert err.response.headers["x-tokenyard-limit"] == "user_requests_per_minute"
    assert 28 <= int(err.response.headers["retry-after"]) <= 30
    # safety_identifier names the user even beside another `user`
    assert refused(lambda: ask(safety_identifier="alice", user="bob")).code == (
        "user_requests_per_minute"
    )
    assert ask(user="bob").headers["x-ratelimit-remaining-requests"] == "1"
    anonymous = ask().headers  # no end user: the team's limits alone
    assert anonymous["x-ratelimit-limit-requests"] == "100"
    assert anonymous["x-ratelimit-remaining-requests"] == "96"  # alice 2, bob 1, this one
    # a user's tokens per minute: reserved at prompt + max_tokens, the unused part refunded
    _, key = team(user_tpm=200)
    client = gateway.client(key)
    for _ in range(2):  # 132 each reserved, 8 used: the second fits only after the refund
        ask(user="gus", max_tokens=120)
    err = refused(lambda: ask(user="gus", max_tokens=300))
    assert err.code == "user_tokens_per_minute" and err.response.headers["retry-after"] == "60"
    ask(user="hal", max_tokens=120)
    # a user's dollars per day: spent, refused as a spent budget, the others go on
    name, key = team(user_usd_per_day=0.5)
    client = gateway.client(key)
    ask(user="carol")
    redis_server.client().incrby(TeamKeys(name).user_day_usd("carol", day_number()), 600_000)
    err = refused(lambda: ask(user="carol"))
    assert err.status_code == 429 and err.code == "insufficient_quota"
    assert "user_usd_per_day" in err.message and "end user 'carol'" in err.message
    ask(user="dave")
    ask()


def test_a_blocked_end_user_is_refused_before_anything_is_reserved(
    gateway: Any, team: Any, sql: Any, redis_server: Any
) -> None:
    """A team's blocked end user gets 403 end_user_blocked (the SDK's PermissionDeniedError),
    whichever field names it, with nothing reserved; other users and anonymous requests go on."""
    name, key = team()
    end_users.block_end_user(sql, name, "mallory", "abuse")
    client = gateway.client(key)
    for who in ({"user": "mallory"}, {"safety_identifier": "mallory", "user": "ok"}):
        with pytest.raises(openai.PermissionDeniedError) as err:
            client.chat.completions.create(
                model=MODEL, messages=chat(), max_tokens=5, extra_body=who
            )
        assert err.value.code == "end_user_blocked" and "'mallory'" in err.value.message
        assert err.value.body["param"] == next(iter(who))  # type: ignore[index]
    with pytest.raises(openai.PermissionDeniedError):
        client.embeddings.create(model=MODEL, input="x", user="mallory")
    assert reservations(redis_server.client(), name)["leases"] == 0
    assert day_tokens(redis_server.client(), name) == 0  # nothing was reserved
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5, user="bob")
    client.chat.completions.create(model=MODEL, messages=chat(), max_tokens=5)


def test_durations_are_written_as_openai_writes_them() -> None:
    assert [duration(s) for s in (0.02, 6, 59.6, 90, 3600)] == [
        "20ms",
        "6s",
        "1m0s",
        "1m30s",
        "60m0s",
    ]
