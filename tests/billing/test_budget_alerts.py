"""Budget alerts: the quota script finds each percent of a dollar budget (a team's or a key's, per
day or per month) that a settle's charge crosses, exactly once however requests interleave; billing
records it with the usage event (once, however often the event is delivered); each gateway's
sender POSTs it to the operator's webhook, signed, retried until it is taken; teams, the admin and
the CLI list them."""

import concurrent.futures
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import openai
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from tests.billing.conftest import ADMIN_KEY, CHARGED, CHAT, MODEL, event
from tests.gateway.conftest import Gateway, tokenyard, wait_until
from tokenyard.billing import alerts, store
from tokenyard.billing.events import alert_rows, decoder, to_row
from tokenyard.billing.models import BudgetAlert
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.webhook_secrets import team_secret

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class _Receiver(BaseHTTPRequestHandler):
    """The operator's receiver: keeps what it was sent; refuses (500) the first POST for the team
    `fail_once` names. Alerts of other tests' teams arrive too: the database is shared, and this
    gateway's sender sends whatever alert is due."""

    fail_once: ClassVar[str | None] = None
    received: ClassVar[list[tuple[bytes, dict[str, str]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        headers = {k.lower(): v for k, v in self.headers.items()} | {"path": self.path}
        self.received.append((body, headers))
        refuse = json.loads(body).get("team") == _Receiver.fail_once
        if refuse:
            _Receiver.fail_once = None
        self.send_response(500 if refuse else 200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gw(
    billing_env: dict[str, str], receiver: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    env = {
        **billing_env,
        "TOKENYARD_BUDGET_ALERT_AT": "100, 50",
        "TOKENYARD_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{receiver}/hooks/T0KEN",
        "TOKENYARD_ALERT_WEBHOOK_SECRET": SECRET,
        "TOKENYARD_ALERT_POLL_S": "0.1",
        "TOKENYARD_ALERT_ATTEMPTS": "2",
    }
    gateway = Gateway(env, tmp_path_factory.mktemp("alerts-gw") / "gateway.log")
    yield gateway
    gateway.stop()


def _sent(team: str) -> list[tuple[dict[str, Any], bytes, dict[str, str]]]:
    """What the receiver got for one team: (payload, body, headers) of each POST, in order."""
    got = [(json.loads(body), body, headers) for body, headers in _Receiver.received]
    return [sent for sent in got if sent[0]["team"] == team]


def _listed(gw: Gateway, key: str, path: str = "/v1/usage/alerts") -> dict[str, Any]:
    return httpx.get(gw.url + path, headers={"authorization": f"Bearer {key}"}).json()


def test_crossed_percents_are_recorded_sent_signed_and_listed(
    gw: Gateway, team: Any, sql: Engine, billing_env: dict[str, str]
) -> None:
    name, team_key = team(usd_per_day=4 * CHARGED)
    _Receiver.fail_once = name  # the team's first alert's first POST fails
    key_limits = {"usd_per_month": 2 * CHARGED}
    budgeted = keys.create_key(sql, name, limits=key_limits).key
    # the budgeted key's request: 25% of the team's day (none), 50% of the key's month
    gw.client(budgeted).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    client = gw.client(team_key)
    for _ in range(3):  # the team's day: 50%, 75%, 100%
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)

    def delivered() -> list[dict[str, Any]]:
        return [a for a in _listed(gw, team_key)["data"] if a["delivered_at"]]

    wait_until(lambda: len(delivered()) == 3, 15, "three alerts delivered")
    listed = _listed(gw, team_key)["data"]  # newest first
    crossed = [(a["budget"], a["percent"], a["key_prefix"]) for a in listed]
    assert crossed == [
        ("usd_per_day", 100, None),
        ("usd_per_day", 50, None),
        ("key_usd_per_month", 50, budgeted[:12]),
    ]
    assert listed[0]["spent_usd"] == pytest.approx(4 * CHARGED)
    assert listed[0]["limit_usd"] == pytest.approx(4 * CHARGED)
    assert f"{name} has spent $0.02 of its daily budget of $0.02 (100% reached" in listed[0]["text"]

    sent = _sent(name)
    ids = [payload["id"] for payload, _, _ in sent]
    assert len(sent) == 4 and len(set(ids)) == 3  # one retried, under the same webhook-id
    assert ids[0] == ids[1]
    for payload, body, headers in sent:  # each try signed afresh: Standard Webhooks' check
        assert Webhook(SECRET).verify(body, headers) == payload
        assert headers["webhook-id"] == payload["id"]
    assert set(ids) == {a["id"] for a in listed}

    # another team sees none of them; the admin sees them by team; so does the CLI
    _, other_key = team()
    assert _listed(gw, other_key)["data"] == []
    admin = _listed(gw, ADMIN_KEY, f"/v1/admin/usage/alerts?team={name}")
    assert [a["id"] for a in admin["data"]] == [a["id"] for a in listed]
    cli = tokenyard(billing_env, ["billing", "alerts", "--team", name, "--json"], check=True)
    assert [json.loads(line)["id"] for line in cli.stdout.splitlines()] == ids[1:][::-1]


def test_a_burst_crosses_each_percent_once(gw: Gateway, team: Any, sql: Engine) -> None:
    """Requests admitted together push the spend past both percents in whatever order their
    settles run: each percent is still one alert, sent once."""
    name, key = team(usd_per_day=3 * CHARGED)
    client = gw.client(key)

    def ask(_: int) -> None:
        with contextlib.suppress(openai.RateLimitError):  # admitted only while under the budget
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(ask, range(8)))

    def rows() -> list[BudgetAlert]:
        with Session(sql) as session:
            return list(session.exec(select(BudgetAlert).where(BudgetAlert.team == name)))

    wait_until(lambda: all(r.delivered_at for r in rows()) and len(_sent(name)) == 2, 15, "sent")
    assert sorted(r.percent for r in rows()) == [50, 100]
    assert [r.claims for r in rows()] == [1, 1]


def test_an_event_delivered_twice_records_its_alerts_once(database: Engine) -> None:
    """The usage consumer may get an event again (claimed from a consumer that died): its row is
    skipped by request id, and its alerts by their budget, period and percent."""
    raw = json.dumps(
        [
            {
                "budget": "key_usd_per_day",
                "period": "2026-11-27",
                "percent": 80,
                "spent": 8,
                "limit": 10,
            }
        ]
    ).encode()
    usage = decoder.decode(json.dumps(event()).encode())
    crossed = alert_rows(raw, usage)
    assert crossed[0]["key_prefix"] == usage.key_prefix and crossed[0]["limit_usd"] == 1e-5
    assert alert_rows(None, usage) == []
    for _ in range(2):
        store.write_or_isolate(database, [to_row(usage)], crossed)
    with Session(database) as session:
        rows = session.exec(select(BudgetAlert)).all()
    assert [(r.budget, r.percent, r.request_id) for r in rows] == [
        ("key_usd_per_day", 80, usage.request_id)
    ]


def test_a_teams_own_receiver_gets_its_alerts_signed_with_its_secret(
    gw: Gateway, team: Any, sql: Engine, receiver: int
) -> None:
    hook = f"http://127.0.0.1:{receiver}/team-hook"
    name, key = team(usd_per_day=2 * CHARGED, alert_url=hook)
    for _ in range(2):
        gw.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10)
    wait_until(lambda: len(_sent(name)) == 4, 15, "two alerts to two receivers")
    theirs = [(p, b, h) for p, b, h in _sent(name) if h["path"] == "/team-hook"]
    assert sorted(p["percent"] for p, _, _ in theirs) == [50, 100]
    secret = team_secret(sql, name)
    assert secret is not None
    for payload, body, headers in theirs:  # the team checks them with its own secret
        assert Webhook(secret).verify(body, headers) == payload
        with pytest.raises(WebhookVerificationError):
            Webhook(SECRET).verify(body, headers)


def test_without_an_operator_receiver_only_teams_with_their_own_are_due(database: Engine) -> None:
    teams.create_team(database, "with-hook", alert_url="https://hooks.example.com/t")
    teams.create_team(database, "without")
    for name in ("with-hook", "without"):
        usage = decoder.decode(json.dumps(event(team=name)).encode())
        raw = json.dumps(
            [
                {
                    "budget": "usd_per_day",
                    "period": "2026-11-27",
                    "percent": 80,
                    "spent": 8,
                    "limit": 10,
                }
            ]
        ).encode()
        store.write(database, [to_row(usage)], alert_rows(raw, usage))
    claimed = alerts.claim(database, 60, every_team=False)
    assert claimed is not None
    alert, url = claimed
    assert (alert.team, url, alert.claims) == ("with-hook", "https://hooks.example.com/t", 1)
    assert alerts.claim(database, 60, every_team=False) is None  # claimed; the other is not due
    other = alerts.claim(database, 60, every_team=True)
    assert other is not None and other[0].team == "without" and other[1] is None
    with pytest.raises(ValueError, match="http or https"):
        teams.update_team(database, "without", alert_url="ftp://hooks.example.com/")
    cleared, _ = teams.update_team(database, "with-hook", alert_url="")
    assert cleared.alert_url is None
