"""The batch tier's SQL operations on a SQLite file: claim order between and within teams, the
list cursor, ids of a shape never made."""

from pathlib import Path

import pytest
from sqlalchemy import Engine, update
from sqlmodel import col

from tokenyard.batch import jobs, lifecycle
from tokenyard.batch.files import Line
from tokenyard.batch.models import BatchJob
from tokenyard.core.db import get_engine

CHAT = "/v1/chat/completions"


@pytest.fixture
def sql(tmp_path: Path) -> Engine:
    return get_engine(f"sqlite:///{tmp_path}/jobs.db")


def _job(sql: Engine, team: str, created_at: int, requests: int = 1, priority: int = 0) -> str:
    lines = [Line(custom_id=f"r{i}", body=b"{}") for i in range(requests)]
    job = jobs.create_job(
        sql, team=team, key_prefix="k", endpoint=CHAT, lines=lines, window_s=3600, priority=priority
    )
    with sql.begin() as conn:  # creation times in whole seconds: set them apart
        conn.execute(
            update(BatchJob).where(col(BatchJob.id) == job.id).values(created_at=created_at)
        )
    return job.id


def _claim_jobs(sql: Engine, limit: int) -> list[str]:
    return [c.batch_id for c in lifecycle.claim(sql, "gw", 60, limit)]


def test_priority_never_moves_a_team_ahead_of_another(sql: Engine) -> None:
    now = 1_900_000_000
    older_b = _job(sql, "b", now - 10)
    urgent_a = _job(sql, "a", now, requests=3, priority=100)
    # team b's older job is not starved by team a's top priority
    assert _claim_jobs(sql, 1) == [older_b]
    assert _claim_jobs(sql, 2) == [urgent_a, urgent_a]


def test_priority_orders_a_teams_own_jobs(sql: Engine) -> None:
    now = 1_900_000_000
    first = _job(sql, "a", now - 10, requests=2)
    urgent = _job(sql, "a", now, requests=2, priority=5)
    other = _job(sql, "b", now - 5, requests=2)
    # a's highest priority first among a's own; the teams take turns by job (in a turn, the
    # older job first): a's older job comes second, after b's
    assert _claim_jobs(sql, 6) == [other, other, urgent, urgent, first, first]


def test_another_teams_batch_as_cursor_is_a_missing_one(sql: Engine) -> None:
    now = 1_900_000_000
    b_old = _job(sql, "b", now - 20)
    a_job = _job(sql, "a", now - 10)
    b_new = _job(sql, "b", now)
    everything = [b_new, b_old]

    def listed(after: str | None) -> list[str]:
        return [j.id for j in jobs.list_jobs(sql, "b", after, 10)]

    assert listed(None) == everything
    assert listed(b_new) == [b_old]  # b's own cursor pages
    missing = "batch_" + "0" * 24
    assert listed(a_job) == listed(missing) == everything


@pytest.mark.parametrize("ident", ["", "batch_\x00", "batch_" + "a" * 5000, "../batch_1", "x"])
def test_ids_never_made_name_nothing(sql: Engine, ident: str) -> None:
    assert jobs.get_job(sql, "a", ident) is None
    assert jobs.cancel_job(sql, "a", ident) is None
    assert jobs.get_file(sql, "a", ident) is None
    assert jobs.list_jobs(sql, "a", ident, 10) == []
