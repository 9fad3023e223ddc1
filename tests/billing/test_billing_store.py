"""The SQL side on SQLite and PostgreSQL: idempotent batches, rollups equal to the records, reports
and CSV, and migrations that match the models."""

import random
import subprocess
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import msgspec
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, Table, create_engine, inspect, text
from sqlmodel import Session, SQLModel, select

from tests.billing.conftest import event, record_sums, records
from tokenyard.billing import reports, store
from tokenyard.billing.events import decoder, to_row
from tokenyard.billing.models import ROLLUP_SUMS, UsageDaily
from tokenyard.core.migrate import MIGRATIONS, upgrade
from tokenyard.tenancy.models import Team


def rows(*events: dict) -> list[dict]:
    return [to_row(decoder.decode(msgspec.json.encode(e))) for e in events]


def rollup(engine: Engine, team: str, day: date) -> dict:
    with Session(engine) as session:
        got = session.exec(
            select(UsageDaily).where(UsageDaily.team == team, UsageDaily.day == day)
        ).all()
    return {name: sum(getattr(r, name) for r in got) for name in ROLLUP_SUMS}


def test_redelivered_events_are_recorded_once(database: Engine) -> None:
    batch = rows(event(team="a"), event(team="a", status=502), event(team="a"))
    assert store.write(database, batch) == 3
    # re-delivered events, one of them twice in one batch, beside one new event
    again = [batch[1], *rows(event(team="a")), batch[1], batch[0]]
    assert store.write(database, again) == 1
    assert store.write(database, batch) == 0
    assert len(records(database, "a")) == 4
    today = datetime.now(UTC).date()
    sums = record_sums(database, "a", today)
    assert sums["requests"] == 4 and sums["errors"] == 1
    assert rollup(database, "a", today) == pytest.approx(sums)


def test_rollups_equal_the_sum_of_records(database: Engine) -> None:
    rng = random.Random(7)
    days = [datetime(2026, 5, d, 12, tzinfo=UTC).timestamp() for d in (1, 2)]
    events = [
        event(
            team=rng.choice(["a", "b"]),
            key_prefix=rng.choice(["ty-k1", "ty-k2", ""]),  # "": a record that names no key
            model_served=rng.choice(["m1", "m2"]),
            ts=rng.choice(days),
            status=rng.choice([200, 200, 200, 429, 502]),
            prompt_tokens=rng.randrange(1000),
            cached_tokens=rng.randrange(100),
            completion_tokens=rng.randrange(500),
            cost_usd=rng.random() / 100,
            list_cost_usd=rng.random() / 100,
        )
        for _ in range(300)
    ]
    for start in range(0, 300, 37):  # batches of several teams, models and days each
        store.write(database, rows(*events[start : start + 37]))
    store.write(database, rows(*events[:50]))  # re-delivery changes nothing
    for team in ("a", "b"):
        for day in (date(2026, 5, 1), date(2026, 5, 2)):
            sums = record_sums(database, team, day)
            assert sums["requests"] > 0
            assert rollup(database, team, day) == pytest.approx(sums, rel=1e-9)
    assert (
        sum(r.requests for r in reports.daily(database, date(2026, 5, 1), date(2026, 5, 2))) == 300
    )
    for team in ("a", "b"):
        per_key = reports.by_key(database, date(2026, 5, 1), date(2026, 5, 2), team)
        assert per_key.keys() == {"ty-k1", "ty-k2"}
        for prefix, got in per_key.items():
            sums = record_sums(database, team, key_prefix=prefix)
            assert {n: got[n] for n in ROLLUP_SUMS} == pytest.approx(sums, rel=1e-9)
    assert reports.by_key(database, date(2026, 5, 2), date(2026, 5, 2), "a").keys() == {
        "ty-k1",
        "ty-k2",
    }


def test_the_key_rollup_starts_from_the_records_already_stored(database_url: str) -> None:
    """Migration 0014 builds each key's daily rollup from the records written before it."""
    engine = create_engine(database_url)
    upgrade(engine, "0013")
    at = datetime(2026, 4, 1, 9, tzinfo=UTC).timestamp()
    before = rows(
        event(team="a", key_prefix="ty-k1", ts=at, prompt_tokens=1_500_000_000, cost_usd=0.5),
        event(team="a", key_prefix="ty-k1", ts=at, status=502, prompt_tokens=1_500_000_007),
        event(team="a", key_prefix="ty-k2", ts=at + 86400, completion_tokens=11),
        event(team="a", key_prefix="", ts=at),  # no key: in no key's rollup
    )
    then = Table("usage_record", MetaData(), autoload_with=engine)  # its columns at 0013
    names = [column.name for column in then.columns]
    with engine.begin() as conn:
        conn.execute(then.insert(), [{k: row[k] for k in names if k in row} for row in before])
    upgrade(engine)
    store.write(engine, rows(event(team="a", key_prefix="ty-k1", ts=at, prompt_tokens=5)))
    per_key = reports.by_key(engine, date(2026, 4, 1), date(2026, 4, 2), "a")
    assert per_key.keys() == {"ty-k1", "ty-k2"}
    first = per_key["ty-k1"]
    # 64-bit sums on PostgreSQL too, where INTEGER stops at 2**31
    assert (first["requests"], first["errors"], first["prompt_tokens"]) == (3, 1, 3_000_000_012)
    assert first["cost_usd"] == pytest.approx(0.5 + 0.001 + 0.001)  # the events' default cost
    assert (per_key["ty-k2"]["requests"], per_key["ty-k2"]["completion_tokens"]) == (1, 11)
    # as JSON numbers: PostgreSQL's sums of 64-bit counts come back as Decimals
    assert type(first["prompt_tokens"]) is int and type(first["cost_usd"]) is float


def test_usage_by_end_user_groups_the_records(database: Engine) -> None:
    at = datetime(2026, 7, 1, 12, tzinfo=UTC).timestamp()
    store.write(
        database,
        rows(
            event(team="a", end_user="ann", ts=at, prompt_tokens=10, cost_usd=0.25),
            event(team="a", end_user="ann", ts=at, status=500, prompt_tokens=1, cost_usd=0.0),
            event(
                team="a",
                end_user="bob",
                ts=at + 86400,
                prompt_tokens=0,
                completion_tokens=7,
                cost_usd=0.1,
            ),
            event(team="a", ts=at, cost_usd=0.1),  # names no one
            event(team="a", end_user="cy", ts=at, cost_usd=0.1),
            event(team="b", end_user="ann", ts=at, cost_usd=9.0),
            event(team="a", end_user="old", ts=at - 86400, cost_usd=5.0),  # before the range
        ),
    )
    got = reports.by_end_user(database, date(2026, 7, 1), date(2026, 7, 2), "a", 10)
    # dearest first; ties by name, the requests that named none last, in both databases
    assert [(u["user"], u["requests"], u["errors"]) for u in got] == [
        ("ann", 2, 1),
        ("bob", 1, 0),
        ("cy", 1, 0),
        (None, 1, 0),
    ]
    assert (got[0]["prompt_tokens"], got[1]["total_tokens"]) == (11, 7)
    assert type(got[0]["prompt_tokens"]) is int and got[0]["cost_usd"] == pytest.approx(0.25)
    assert [
        u["user"] for u in reports.by_end_user(database, date(2026, 7, 1), date(2026, 7, 1), "a", 2)
    ] == ["ann", "cy"]
    every = reports.by_end_user(database, date(2026, 7, 1), date(2026, 7, 2), None, 10)
    assert (every[0]["team"], every[0]["user"]) == ("b", "ann")
    csv = reports.labelled_to_csv(got, reports.USER_CSV_COLUMNS)
    assert csv.splitlines()[4].startswith(",a,1,0,")


def test_usage_by_metadata_groups_the_records_by_one_keys_values(database: Engine) -> None:
    at = datetime(2026, 7, 1, 12, tzinfo=UTC).timestamp()
    search, chat = {"feature": "search", "env": "prod"}, {"feature": "chat", "équipe": "café"}
    store.write(
        database,
        rows(
            event(team="a", metadata=search, ts=at, cost_usd=0.25),
            event(team="a", metadata=search, ts=at + 86400, status=500, cost_usd=0.05),
            event(team="a", metadata=chat, ts=at, prompt_tokens=3, cost_usd=0.2),
            event(team="a", metadata={"env": "prod"}, ts=at, cost_usd=0.1),  # no feature
            event(team="a", ts=at, cost_usd=0.01),  # no metadata at all
            event(team="b", metadata=chat, ts=at, cost_usd=9.0),
            event(team="a", metadata=chat, ts=at - 86400, cost_usd=5.0),  # before the range
        ),
    )
    got = reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 2), "a", "feature", 10)
    assert [(r["value"], r["requests"], r["errors"]) for r in got] == [
        ("search", 2, 1),
        ("chat", 1, 0),
        (None, 2, 0),  # without the key, with or without other metadata
    ]
    assert got[0]["cost_usd"] == pytest.approx(0.30) and got[1]["prompt_tokens"] == 3
    assert type(got[1]["prompt_tokens"]) is int
    by_env = reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 2), "a", "env", 1)
    assert [(r["value"], r["requests"]) for r in by_env] == [("prod", 3)]
    every = reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 1), None, "feature", 10)
    assert (every[0]["team"], every[0]["value"]) == ("b", "chat")
    # a key outside ASCII is found as written (SQLite's paths match characters, not escapes)
    accented = reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 2), "a", "équipe", 9)
    assert [(r["value"], r["requests"]) for r in accented] == [(None, 4), ("café", 1)]
    with pytest.raises(ValueError, match="double quote"):
        reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 2), "a", 'x"y', 10)
    # a key that could break out of a JSON path in the SQL is only a key that nothing has
    odd = reports.by_metadata(database, date(2026, 7, 1), date(2026, 7, 2), "a", "x') OR ('1", 10)
    assert [(r["value"], r["requests"]) for r in odd] == [(None, 5)]
    csv = reports.labelled_to_csv(got, reports.METADATA_CSV_COLUMNS).splitlines()
    assert csv[0].startswith("value,team,requests,") and csv[3].startswith(",a,2,0,")


def test_reports_by_range_team_and_csv(database: Engine) -> None:
    at = [datetime(2026, 6, d, tzinfo=UTC).timestamp() for d in (1, 2, 3)]
    store.write(
        database,
        rows(
            event(team="a", ts=at[0], prompt_tokens=10, completion_tokens=1, cached_tokens=0),
            event(
                team="a",
                ts=at[1],
                prompt_tokens=20,
                completion_tokens=2,
                cached_tokens=5,
                cache_write_tokens=4,
            ),
            event(team="b", ts=at[1], prompt_tokens=40, completion_tokens=4, cached_tokens=0),
            event(team="a", ts=at[2], prompt_tokens=80, completion_tokens=8, cached_tokens=0),
            event(team="a", ts=at[1], key_prefix="ty-a2", status=429, prompt_tokens=0),
        ),
    )
    two_days = reports.daily(database, date(2026, 6, 1), date(2026, 6, 2), "a")
    assert [(r.day.day, r.team) for r in two_days] == [(1, "a"), (2, "a")]
    summary = reports.summary(two_days)
    assert summary["models"]["m"]["prompt_tokens"] == 30
    assert (summary["requests"], summary["cached_tokens"], summary["total_tokens"]) == (3, 7, 38)
    # each key's totals over the range, of one team (prefixes as recorded, never the key)
    per_key = reports.by_key(database, date(2026, 6, 1), date(2026, 6, 2), "a")
    assert per_key.keys() == {"ty-abcdefghi", "ty-a2"}
    first = per_key["ty-abcdefghi"]
    assert (first["team"], first["requests"], first["errors"], first["prompt_tokens"]) == (
        "a",
        2,
        0,
        30,
    )
    assert (first["total_tokens"], first["cost_usd"]) == (33, pytest.approx(0.002))
    assert (per_key["ty-a2"]["requests"], per_key["ty-a2"]["errors"]) == (1, 1)
    assert reports.by_key(database, date(2026, 6, 3), date(2026, 6, 3), "b") == {}
    everyone = reports.daily(database, date(2026, 6, 2), date(2026, 6, 2))
    assert {r.team for r in everyone} == {"a", "b"}
    lines = reports.to_csv(everyone).splitlines()
    assert lines[0] == "day,team,model," + ",".join(ROLLUP_SUMS)
    # cached 5 + the default event's 2; cache writes 4 (another 0)
    assert lines[1].startswith("2026-06-02,a,m,2,1,20,7,4,7,")


def test_migrations_match_the_models(database: Engine) -> None:
    """Every table, gateway's included, is made by the migrations: a model changed without a
    migration fails here (add one: `alembic -c tokenyard/core/alembic.ini revision
    --autogenerate`)."""

    def ours(obj: object, name: str, kind: str, reflected: bool, model: object) -> bool:
        # a table only in the database belongs to models this process did not import
        table = obj if kind == "table" else getattr(obj, "table", None)
        return table is None or table.name in SQLModel.metadata.tables

    with database.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": ours})
        assert compare_metadata(context, SQLModel.metadata) == []
    upgrade(database)  # again: a no-op


def test_a_database_from_before_migrations_is_adopted(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}/old.db")
    SQLModel.metadata.tables["team"].create(engine)
    SQLModel.metadata.tables["apikey"].create(engine)
    with Session(engine) as session:
        session.add(Team(name="kept"))
        session.commit()
    with engine.begin() as conn:  # the columns added since then (migrations 0004, 0009-0036)
        added = ("webhook_secret", "disabled", "auto_quality", "cache_ttl_s", "user_rpm")
        later = ("user_tpm", "user_usd_per_day", "usd_per_month", "alert_url", "model_limits")
        later += ("webhook_url", "scopes", "webhook_url_by_team", "deployment_tags")
        for column in (*added, *later):
            conn.execute(text(f"ALTER TABLE team DROP COLUMN {column}"))
        added = ("name", "expires_at", "models", "rpm", "tpm", "usd_per_day", "concurrency")
        for column in (*added, "usd_per_month", "model_limits", "scopes"):
            conn.execute(text(f"ALTER TABLE apikey DROP COLUMN {column}"))
    upgrade(engine)
    assert {"usage_record", "usage_daily"} <= set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            == ScriptDirectory(str(MIGRATIONS)).get_current_head()
        )
    with Session(engine) as session:
        assert [t.name for t in session.exec(select(Team))] == ["kept"]


def test_processes_migrating_one_fresh_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    code = (
        "from tokenyard.core.migrate import upgrade; from sqlalchemy import create_engine; "
        f"upgrade(create_engine({url!r}))"
    )
    command = [sys.executable, "-c", code]
    procs = [subprocess.Popen(command, stderr=subprocess.PIPE) for _ in range(3)]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    tables = set(inspect(create_engine(url)).get_table_names())
    assert {"team", "apikey", "usage_record", "alembic_version"} <= tables
