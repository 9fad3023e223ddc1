"""Billing through real gateways: every request recorded from the usage stream, priced by engine
time, streamed requests billed like whole ones, daily dollar budgets enforced from the costs, the
usage API (team-scoped, admin, CSV), the report CLI and the cost counters."""

import csv
import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine

from tests.billing.conftest import (
    ADMIN_KEY,
    CHARGED,
    CHAT,
    COMPUTE_S,
    MODEL,
    list_price,
    record_sums,
    records,
)
from tests.gateway.conftest import Gateway, tokenyard, wait_until
from tokenyard.billing.models import UsageRecord
from tokenyard.core.usage import USAGE_STREAM
from tokenyard.gateway.quotas import TeamKeys, day_number, month_of
from tokenyard.tenancy import keys


@pytest.fixture(scope="module")
def gw(billing_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = Gateway(billing_env, tmp_path_factory.mktemp("billing-gw") / "gateway.log")
    yield gateway
    gateway.stop()


def wait_records(sql: Engine, team: str, count: int) -> list[UsageRecord]:
    wait_until(lambda: len(records(sql, team)) >= count, 10, f"{count} usage records of {team}")
    got = records(sql, team)
    assert len(got) == count
    return got


def usage(gw: Gateway, key: str, query: str = "") -> httpx.Response:
    return httpx.get(gw.url + "/v1/usage" + query, headers={"authorization": f"Bearer {key}"})


def test_a_record_names_the_key_however_it_was_sent(gw: Gateway, team: Any, sql: Engine) -> None:
    """The scheme in any case, or Anthropic's x-api-key: the record names the key's prefix (the
    authenticated key's, never parsed again from a header), never the key."""
    name, key = team()
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
    for headers in ({"authorization": f"BEARER {key}"}, {"x-api-key": key}):
        sent = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert sent.status_code == 200, sent.text
    assert [r.key_prefix for r in wait_records(sql, name, 2)] == [key[:12]] * 2


def test_usage_by_end_user(gw: Gateway, team: Any, sql: Engine, billing_env: dict) -> None:
    """Each record names the end user its request was for (`safety_identifier` over `user`,
    bounded); a team reads its own end users' totals, dearest first, and never another team's."""
    name, key = team()
    client = gw.client(key)
    for user, count in (("ann", 3), ("bob", 1)):
        for _ in range(count):
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, user=user)
    client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=10,
        user="ignored",
        extra_body={"safety_identifier": "cy"},
    )
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)  # names no one
    # legacy completions name one too, kept to 128 characters
    client.completions.create(model=MODEL, prompt="x", max_tokens=2, user="e" * 300)
    other, other_key = team()
    gw.client(other_key).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=10, user="ann"
    )
    got = wait_records(sql, name, 7)
    wait_records(sql, other, 1)  # the admin reads it below
    assert sorted((r.end_user or "") for r in got) == sorted(
        ["ann"] * 3 + ["bob", "cy", "", "e" * 128]
    )

    def users(path: str, auth: str, query: str = "") -> httpx.Response:
        return httpx.get(
            f"{gw.url}{path}{query}", headers={"authorization": f"Bearer {auth}"}, timeout=10
        )

    listed = users("/v1/usage/users", key).json()
    assert (listed["object"], listed["team"], listed["has_more"]) == ("list", name, False)
    rows = {row["user"]: row for row in listed["data"]}
    assert set(rows) == {"ann", "bob", "cy", None, "e" * 128}
    assert listed["data"][0]["user"] == "ann"  # three requests: the dearest
    assert rows["ann"]["requests"] == 3 and rows["ann"]["errors"] == 0
    assert rows["bob"]["cost_usd"] > 0
    assert rows["ann"]["cost_usd"] == pytest.approx(3 * rows["bob"]["cost_usd"])
    assert rows["ann"]["total_tokens"] == 3 * rows["bob"]["total_tokens"]
    assert all(row["team"] == name for row in listed["data"])  # the other team's ann is not here
    first = users("/v1/usage/users", key, "?limit=1").json()
    assert [row["user"] for row in first["data"]] == ["ann"] and first["has_more"]
    for bad in ("?limit=0", "?limit=x", "?limit=1001", "?date=yesterday"):
        refused = users("/v1/usage/users", key, bad)
        assert refused.status_code == 400, bad
        assert refused.json()["error"]["param"] in ("limit", "date")
    # the admin reads any team's, or every team's
    assert users("/v1/admin/usage/users", key).status_code == 401
    theirs = users("/v1/admin/usage/users", ADMIN_KEY, f"?team={other}").json()["data"]
    assert [(row["team"], row["user"], row["requests"]) for row in theirs] == [(other, "ann", 1)]
    everyone = users("/v1/admin/usage/users", ADMIN_KEY, "?limit=1000").json()["data"]
    assert {(other, "ann"), (name, "ann")} <= {(row["team"], row["user"]) for row in everyone}
    report = tokenyard(
        billing_env,
        ["billing", "report", "--team", name, "--by", "user", "--limit", "2", "--csv"],
        check=True,
    ).stdout.splitlines()
    assert report[0].startswith("user,team,requests,errors,")
    assert [line.split(",")[:3] for line in report[1:]] == [["ann", name, "3"], ["bob", name, "1"]]


def test_usage_by_metadata(gw: Gateway, team: Any, sql: Engine, billing_env: dict) -> None:
    """A request's `metadata` (OpenAI's: up to 16 string pairs) is recorded with its usage, on
    every provider, through Chat Completions and the Responses API alike; a team reads its spend
    by the values of any one key, never another team's; out-of-bounds metadata is a 400."""
    name, key = team()
    client = gw.client(key)
    for feature, count in (("search", 2), ("chat", 1)):
        for _ in range(count):
            client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=10, metadata={"feature": feature}
            )
    client.responses.create(model=MODEL, input="hi", metadata={"feature": "chat", "env": "dev"})
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    other, other_key = team()
    gw.client(other_key).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=10, metadata={"feature": "search"}
    )
    got = wait_records(sql, name, 5)
    wait_records(sql, other, 1)  # recorded apart: read below through the admin's view
    kept = [r.request_metadata for r in got]
    assert sorted((m or {}).get("feature", "-") for m in kept) == [
        "-",
        "chat",
        "chat",
        "search",
        "search",
    ]
    assert {"feature": "chat", "env": "dev"} in kept and None in kept

    def by(path: str, auth: str, query: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {auth}"}
        return httpx.get(f"{gw.url}{path}{query}", headers=headers, timeout=10)

    listed = by("/v1/usage/metadata", key, "?key=feature").json()
    assert (listed["object"], listed["team"], listed["key"]) == ("list", name, "feature")
    assert {r["value"]: r["requests"] for r in listed["data"]} == {"search": 2, "chat": 2, None: 1}
    costs = [r["cost_usd"] for r in listed["data"]]
    assert costs == sorted(costs, reverse=True) and costs[-1] > 0  # dearest first
    theirs = by("/v1/admin/usage/metadata", ADMIN_KEY, f"?key=feature&team={other}").json()
    assert [(r["team"], r["value"]) for r in theirs["data"]] == [(other, "search")]
    too_long, quoted, no_limit = "?key=" + "k" * 65, "?key=a%22b", "?key=a&limit=0"
    for bad, param in (("", "key"), (too_long, "key"), (quoted, "key"), (no_limit, "limit")):
        refused = by("/v1/usage/metadata", key, bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, bad
    assert by("/v1/admin/usage/metadata", key, "?key=feature").status_code == 401
    for metadata in (
        {str(i): "v" for i in range(17)},
        {"k": "v" * 513},
        {"k" * 65: "v"},
        {"k": 1},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=10,
                metadata=metadata,  # type: ignore[arg-type]
            )
        assert err.value.body["param"] == "metadata"  # type: ignore[index]
    report = tokenyard(
        billing_env,
        ["billing", "report", "--team", name, "--by", "metadata", "--key", "feature"],
        check=True,
    ).stdout.splitlines()
    assert report[0].split()[:4] == ["feature", "team", "requests", "errors"]
    assert sorted(line.split()[:3] for line in report[1:]) == [
        ["-", name, "1"],
        ["chat", name, "2"],
        ["search", name, "2"],
    ]
    keyless = tokenyard(billing_env, ["billing", "report", "--by", "metadata"])
    assert keyless.returncode == 2 and "--key" in keyless.stderr
    quoted_key = tokenyard(billing_env, ["billing", "report", "--by", "metadata", "--key", 'a"b'])
    assert quoted_key.returncode == 2 and "double quote" in quoted_key.stderr


def test_streamed_requests_are_billed_like_whole_ones(gw: Gateway, team: Any, sql: Engine) -> None:
    name, key = team()
    client = gw.client(key)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, stream=True)
    )
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage; billing did
    # a stream that breaks before its usage chunk: billed from what was counted
    with pytest.raises(openai.APIError):
        list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x #fail=2"}], stream=True
            )
        )
    got = sorted(wait_records(sql, name, 3), key=lambda r: (r.status, r.stream))
    whole, streamed, broken = got
    assert (whole.stream, streamed.stream, broken.stream) == (False, True, True)
    for r in (whole, streamed):
        assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (5, 5, 0)
        assert r.usage_reported and r.status == 200 and r.provider == "self-hosted"
        assert r.cost_usd == pytest.approx(CHARGED)
        assert r.list_cost_usd == pytest.approx(list_price(5, 0, 5))
        assert r.compute_s == COMPUTE_S and r.key_prefix == key[:12] and r.team == name
    assert broken.status == 502 and not broken.usage_reported
    assert broken.completion_tokens == 2  # the chunks that were streamed
    assert broken.cost_usd == broken.list_cost_usd > 0  # no engine time reported: list price


def test_daily_dollar_budget_is_enforced_from_costs(
    gw: Gateway, team: Any, redis_server: Any
) -> None:
    name, key = team(usd_per_day=2.5 * CHARGED)
    client = gw.client(key)
    for _ in range(3):  # $0, $0.005, $0.010 spent before each: under $0.0125
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    spent = int(redis_server.client().get(f"ty:{{{name}}}:usd:{day_number()}"))
    assert spent == round(3 * CHARGED * 1_000_000)
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    assert err.value.code == "insufficient_quota"
    assert err.value.response.headers["x-tokenyard-limit"] == "usd_per_day"


def test_each_end_users_dollar_budget_is_charged_and_enforced(
    gw: Gateway, team: Any, redis_server: Any
) -> None:
    """Settle charges a request's spend to its end user's own day counter where the team budgets
    each end user; over it, that user is refused while another user and requests naming none go
    on (and are never charged to a user's counter)."""
    name, key = team(user_usd_per_day=1.5 * CHARGED)
    client = gw.client(key)
    for _ in range(2):  # $0, then $0.005 spent before each: under $0.0075
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, user="erin")
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    counters, names = redis_server.client(), TeamKeys(name)
    assert int(counters.get(names.user_day_usd("erin", day_number()))) == round(
        2 * CHARGED * 1_000_000
    )
    assert counters.get(names.user_day_usd("", day_number())) is None
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, user="erin")
    assert err.value.code == "insufficient_quota" and "'erin'" in err.value.message
    assert err.value.response.headers["x-tokenyard-limit"] == "user_usd_per_day"
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, user="frank")
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)


def test_monthly_dollar_budget_is_charged_and_enforced(
    gw: Gateway, team: Any, redis_server: Any
) -> None:
    """Settle charges a team's spend to its month's counter too, where it has a monthly budget;
    reserve refuses once the month's spend reaches it."""
    name, key = team(usd_per_month=2.5 * CHARGED)
    client = gw.client(key)
    for _ in range(3):  # $0, $0.005, $0.010 spent before each: under $0.0125
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    spent = redis_server.client().get(TeamKeys(name).month_usd(month_of()[0]))
    assert int(spent) == round(3 * CHARGED * 1_000_000)
    assert redis_server.client().get(TeamKeys(name).day_usd(day_number())) is None  # no day budget
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    assert err.value.code == "insufficient_quota"
    assert err.value.response.headers["x-tokenyard-limit"] == "usd_per_month"
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    budget = httpx.get(f"{gw.url}/v1/admin/teams/{name}/budget", headers=admin).json()
    assert budget["usd_per_month"] == pytest.approx(2.5 * CHARGED)
    assert budget["today"]["usd_month"] == pytest.approx(3 * CHARGED)


def test_a_keys_own_dollar_budget_is_charged_and_enforced(
    gw: Gateway, team: Any, redis_server: Any, sql: Engine
) -> None:
    """Settle charges a budgeted key's spend to the key's own counter as well as to its team's;
    over the key's budget the key is refused, its team's other keys are not."""
    name, team_key = team()  # no team budget
    limits = {"usd_per_day": 1.5 * CHARGED, "usd_per_month": 100.0}
    budgeted = keys.create_key(sql, name, limits=limits).key
    client = gw.client(budgeted)
    for _ in range(2):  # $0, then $0.005 spent before each: under $0.0075
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    spent = redis_server.client().get(TeamKeys(name).key_day_usd(budgeted[:12], day_number()))
    assert int(spent) == round(2 * CHARGED * 1_000_000)
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    assert err.value.code == "insufficient_quota" and budgeted[:12] in err.value.message
    assert err.value.response.headers["x-tokenyard-limit"] == "key_usd_per_day"
    gw.client(team_key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    # the admin API shows the key with today's use of its budget; a key without one, none
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    shown = httpx.get(f"{gw.url}/v1/admin/keys/{budgeted[:12]}", headers=admin).json()
    assert shown["limits"]["usd_per_day"] == pytest.approx(1.5 * CHARGED)
    assert shown["today"]["usd"] == pytest.approx(2 * CHARGED)
    assert shown["today"]["usd_month"] == pytest.approx(2 * CHARGED)  # its monthly counter too
    plain = httpx.get(f"{gw.url}/v1/admin/keys/{team_key[:12]}", headers=admin).json()
    assert plain["today"] is None and plain["team"] == name
    missing = httpx.get(f"{gw.url}/v1/admin/keys/ty-nosuchkey", headers=admin)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_usage_api_cli_and_metrics(gw: Gateway, team: Any, sql: Engine, billing_env: dict) -> None:
    a, key_a = team()
    b, key_b = team()
    for _ in range(2):
        gw.client(key_a).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    with pytest.raises(openai.BadRequestError):
        gw.client(key_b).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x #status=400"}]
        )
    other_b = keys.create_key(sql, b, "second").key  # b's usage splits over two keys
    gw.client(other_b).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    wait_records(sql, a, 2)
    wait_records(sql, b, 2)
    today = datetime.now(UTC).date().isoformat()

    mine = usage(gw, key_a).json()
    assert (mine["team"], mine["date"], mine["end"]) == (a, today, today)
    assert mine["models"][MODEL] == {
        "requests": 2,
        "errors": 0,
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "completion_tokens": 10,
        "cost_usd": pytest.approx(2 * CHARGED),
        "list_cost_usd": pytest.approx(2 * list_price(5, 0, 5)),
        "total_tokens": 20,
    }
    assert [row["team"] for row in mine["data"]] == [a]  # never another team's rows
    assert mine["keys"] == {key_a[:12]: {"team": a, **mine["models"][MODEL]}}  # nor keys
    theirs = usage(gw, key_b, f"?date={today}&end={today}").json()
    assert (theirs["requests"], theirs["errors"]) == (2, 1)
    per_key = {prefix: (k["requests"], k["errors"]) for prefix, k in theirs["keys"].items()}
    assert per_key == {key_b[:12]: (1, 1), other_b[:12]: (1, 0)}
    assert theirs["keys"][other_b[:12]]["cost_usd"] == pytest.approx(CHARGED)

    exported = usage(gw, key_a, "?format=csv")
    assert exported.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(exported.text)))
    assert [(r["team"], r["model"], r["requests"]) for r in table] == [(a, MODEL, "2")]

    for query, param in [
        ("?date=yesterday", "date"),
        ("?end=2020-01-01", "end"),
        ("?date=2026-01-01&end=2027-06-01", "end"),
        ("?format=xml", "format"),
    ]:
        bad = usage(gw, key_a, query)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param

    admin = gw.url + "/v1/admin/usage"
    assert httpx.get(admin, headers={"authorization": f"Bearer {key_a}"}).status_code == 401
    everyone = httpx.get(admin, headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert {a, b} <= {row["team"] for row in everyone["data"]}
    assert {key_a[:12], key_b[:12], other_b[:12]} <= everyone["keys"].keys()
    only_b = httpx.get(admin + f"?team={b}", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert {row["team"] for row in only_b.json()["data"]} == {b}

    report = tokenyard(
        billing_env, ["billing", "report", "--date", today, "--team", a, "--csv"], check=True
    )
    assert report.stdout.splitlines()[1].startswith(f"{today},{a},{MODEL},2,0,10,0,0,10,")
    for flags in (["--csv"], []):
        by_key = tokenyard(
            billing_env, ["billing", "report", "--team", b, "--by", "key", *flags], check=True
        ).stdout.splitlines()
        assert by_key[0].startswith("key") and "requests" in by_key[0]  # the header
        cells = sorted(line.replace(",", " ").split()[:4] for line in by_key[1:])
        assert cells == sorted([[key_b[:12], b, "1", "1"], [other_b[:12], b, "1", "0"]])
    assert record_sums(sql, a, datetime.now(UTC).date())["requests"] == 2

    scraped = httpx.get(gw.url + "/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    charged = f'tokenyard_billing_cost_usd_total{{basis="charged",model="{MODEL}",team="{a}"}}'
    line = next(x for x in scraped.splitlines() if x.startswith(charged))
    assert float(line.split()[-1]) == pytest.approx(2 * CHARGED)


def test_stream_usage_is_durable_before_done_and_finish_reasons_recorded(
    gw: Gateway, team: Any, sql: Engine, redis_server: Any
) -> None:
    name, key = team()
    request_id = "req-" + uuid.uuid4().hex
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 10, "stream": True}
    headers = {"authorization": f"Bearer {key}", "x-request-id": request_id}
    saw_done = False
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                saw_done = True
                # the moment the client sees the end, the event is in Redis (or already in SQL)
                stream = redis_server.client().xrange(USAGE_STREAM)
                in_redis = any(request_id.encode() in f[b"event"] for _, f in stream)
                in_sql = request_id in {rec.client_request_id for rec in records(sql, name)}
                assert in_redis or in_sql
    assert saw_done
    gw.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    got = wait_records(sql, name, 2)
    assert [rec.finish_reason for rec in got] == ["length", "length"]
    assert all(rec.ttft_s is not None for rec in got)


def test_the_request_log_shows_each_of_a_teams_requests(
    gw: Gateway, team: Any, sql: Engine, billing_env: dict[str, str]
) -> None:
    """`GET /v1/usage/requests`: each request as its record has it, newest first, filtered and
    paged by id; a team sees only its own; the admin any team's; the CLI the same rows."""
    name, key = team()
    client = gw.client(key)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, user="ida")
    client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_headers={"x-client-request-id": "mine-7"}
    )
    with pytest.raises(openai.BadRequestError):  # the upstream refuses it: a record, status 400
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x #status=400"}], max_tokens=2
        )
    wait_records(sql, name, 3)

    def log(query: str = "", who: str = key, path: str = "/v1/usage/requests") -> Any:
        r = httpx.get(gw.url + path + query, headers={"authorization": f"Bearer {who}"})
        assert r.status_code == 200, r.text
        return r.json()

    entries = log()["data"]
    assert [e["status"] for e in entries] == [400, 200, 200]  # newest first
    first = entries[2]
    assert (first["end_user"], first["completion_tokens"], first["team"]) == ("ida", 3, name)
    assert first["cost_usd"] == pytest.approx(CHARGED) and first["key_prefix"] == key[:12]
    assert [e["status"] for e in log("?status=error")["data"]] == [400]
    assert [e["end_user"] for e in log("?user=ida")["data"]] == ["ida"]
    (mine,) = log("?request_id=mine-7")["data"]
    assert mine["client_request_id"] == "mine-7" and mine["completion_tokens"] == 2
    assert log(f"?request_id={mine['request_id']}")["data"] == [mine]
    page = log("?limit=2")
    assert page["has_more"] and [e["id"] for e in page["data"]] == [e["id"] for e in entries[:2]]
    rest = log(f"?limit=2&before={page['data'][-1]['id']}")
    assert not rest["has_more"] and rest["data"] == entries[2:]
    assert log("?model=no-such-model")["data"] == []

    _, other = team()
    assert log(who=other)["data"] == []  # never another team's
    admin = log(f"?team={name}", ADMIN_KEY, "/v1/admin/usage/requests")["data"]
    assert [e["request_id"] for e in admin] == [e["request_id"] for e in entries]
    for bad in ("?limit=0", "?before=x", "?status=ok"):
        r = httpx.get(
            gw.url + "/v1/usage/requests" + bad, headers={"authorization": f"Bearer {key}"}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == bad[1:].split("=")[0]
    cli = tokenyard(
        billing_env, ["billing", "requests", "--team", name, "--errors", "--json"], check=True
    )
    assert [json.loads(line)["status"] for line in cli.stdout.splitlines()] == [400]
