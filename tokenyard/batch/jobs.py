"""A team's batch files and jobs in SQL, as the Files and Batches API reads and writes them
(synchronous: the API runs them in a thread), and their OpenAI objects. What the worker does to a
job as it runs is batch/lifecycle.py."""

import os
import re
import time
from typing import Any, TypeVar

import msgspec
from sqlalchemy import Engine, delete, func, insert, update
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from tokenyard.batch.files import Line
from tokenyard.batch.models import BatchFile, BatchJob, BatchRequest

_Owned = TypeVar("_Owned", BatchFile, BatchJob)

ACTIVE = ("validating", "in_progress", "cancelling")  # not yet final
CANCELLED = ("batch_cancelled", "The batch was cancelled before this request ran.")
EXPIRED = (
    "batch_expired",
    "This request could not be executed before the completion window expired.",
)


# what new_id makes: a client's id of any other shape names nothing, and is never sent to SQL
# (PostgreSQL refuses a NUL in a parameter outright)
_ID = re.compile(r"(file-|batch_|msgbatch_)[0-9a-f]{24}")
# a job's id says which API made it: OpenAI's Batches (batch_) or Anthropic's Message Batches
# (msgbatch_); each API lists its own
OPENAI_JOB, ANTHROPIC_JOB = "batch_", "msgbatch_"
_INSERT_SLICE = 200  # request rows per INSERT when a job is created (see create_job)


def new_id(prefix: str) -> str:
    """Milliseconds then randomness: ids sort in creation order within a second (lists are newest
    first by `created_at`, whole seconds as OpenAI's objects carry them, then id)."""
    return f"{prefix}{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}"


def create_file(
    engine: Engine, team: str, filename: str, purpose: str, content: bytes
) -> BatchFile:
    with Session(engine, expire_on_commit=False) as session:
        row = BatchFile(
            id=new_id("file-"),
            team=team,
            filename=filename,
            purpose=purpose,
            bytes=len(content),
            created_at=int(time.time()),
            content=content,
        )
        session.add(row)
        session.commit()
        return row


def _owned(engine: Engine, table: type[_Owned], team: str, ident: str) -> _Owned | None:
    """A team's row; another team's is as absent as one that never existed."""
    if not _ID.fullmatch(ident):
        return None
    with Session(engine) as session:
        row = session.get(table, ident)
        return row if row is not None and row.team == team else None


def get_file(engine: Engine, team: str, file_id: str) -> BatchFile | None:
    return _owned(engine, BatchFile, team, file_id)


def create_job(
    engine: Engine,
    *,
    team: str,
    key_prefix: str,
    endpoint: str,
    lines: list[Line],
    window_s: float,
    completion_window: str = "24h",
    input_file_id: str | None = None,
    metadata: dict[str, str] | None = None,
    callback_url: str | None = None,
    priority: int = 0,
    id_prefix: str = OPENAI_JOB,
) -> BatchJob:
    """The job and its requests in one transaction: in progress at once (lines were checked).
    The requests go in as bulk INSERTs: a row object each took seconds for 10,000."""
    now = int(time.time())
    job = BatchJob(
        id=new_id(id_prefix),
        team=team,
        key_prefix=key_prefix,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=completion_window,
        status="in_progress",
        priority=priority,
        metadata_json=msgspec.json.encode(metadata).decode(),
        total=len(lines),
        created_at=now,
        in_progress_at=now,
        expires_at=now + round(window_s),
        callback_url=callback_url,
    )
    with Session(engine, expire_on_commit=False) as session:
        session.add(job)
        session.flush()  # the job's row first: requests reference it
        # in small slices: rows that live through a few young collections reach the oldest
        # generation, and enough of them set off a full pass, which pauses every thread (the event
        # loop's too) for ~0.1 s; 200 rows die young (1,000 set one off per ~30,000 requests)
        for start in range(0, len(lines), _INSERT_SLICE):
            rows = range(start, min(start + _INSERT_SLICE, len(lines)))
            session.execute(insert(BatchRequest), [_request_row(job.id, i, lines[i]) for i in rows])
        session.commit()
        return job


def _request_row(batch_id: str, position: int, line: Line) -> dict[str, Any]:
    code, message = line.error or (None, None)
    return {
        "id": new_id("batch_req_"),
        "batch_id": batch_id,
        "line": position,
        "custom_id": line.custom_id,
        "body": line.body,
        "state": "done" if line.error else "pending",  # a malformed line is failed already
        "error_code": code,
        "error_message": message,
    }


def get_job(engine: Engine, team: str, batch_id: str) -> BatchJob | None:
    return _owned(engine, BatchJob, team, batch_id)


def _page(
    engine: Engine,
    table: type[_Owned],
    team: str,
    after: str | None,
    limit: int,
    *where: Any,
    before: str | None = None,
) -> list[_Owned]:
    """A team's rows, newest first, after the cursor row (OpenAI's `after` pagination), or the
    page just before it (Anthropic's `before_id`: newer ones). A cursor that is not one of the
    team's rows is ignored, another team's exactly as a missing one."""
    newer = before is not None
    cursor = _owned(engine, table, team, before if newer else after) if (before or after) else None
    created, ident = col(table.created_at), col(table.id)
    with Session(engine) as session:
        query = select(table).where(table.team == team, *where)
        if cursor is not None and newer:
            query = query.where(
                (created > cursor.created_at)
                | ((created == cursor.created_at) & (ident > cursor.id))
            )
        elif cursor is not None:
            query = query.where(
                (created < cursor.created_at)
                | ((created == cursor.created_at) & (ident < cursor.id))
            )
        if table is BatchFile:  # a listing never reads the files' contents
            query = query.options(defer(BatchFile.content))  # type: ignore[arg-type]
        if newer:  # the nearest newer rows, then newest first
            query = query.order_by(created.asc(), ident.asc())
            return list(session.exec(query.limit(limit)))[::-1]
        query = query.order_by(created.desc(), ident.desc())
        return list(session.exec(query.limit(limit)))


def list_jobs(
    engine: Engine,
    team: str,
    after: str | None,
    limit: int,
    kind: str = OPENAI_JOB,
    before: str | None = None,
) -> list[BatchJob]:
    """A team's jobs made through one API (`kind`: their ids' prefix), newest first."""
    return _page(
        engine, BatchJob, team, after, limit, col(BatchJob.id).startswith(kind), before=before
    )


def list_files(
    engine: Engine, team: str, purpose: str | None, after: str | None, limit: int
) -> list[BatchFile]:
    where = [] if purpose is None else [BatchFile.purpose == purpose]
    return _page(engine, BatchFile, team, after, limit, *where)


def delete_file(engine: Engine, team: str, file_id: str) -> bool:
    """Delete a team's file; False if it has none by that id. A job that read it has its lines
    already; an output file deleted is gone for its job too, as at OpenAI."""
    if not _ID.fullmatch(file_id):
        return False
    with Session(engine) as session:
        deleted = session.execute(
            delete(BatchFile).where(col(BatchFile.id) == file_id, col(BatchFile.team) == team)
        )
        session.commit()
        return bool(deleted.rowcount)


def cancel_job(engine: Engine, team: str, batch_id: str) -> BatchJob | None:
    if not _ID.fullmatch(batch_id):
        return None
    with Session(engine, expire_on_commit=False) as session:
        session.exec(
            update(BatchJob)  # type: ignore[call-overload]
            .where(
                col(BatchJob.id) == batch_id,
                col(BatchJob.team) == team,
                col(BatchJob.status).in_(("validating", "in_progress")),
            )
            .values(status="cancelling", cancelling_at=int(time.time()))
        )
        session.commit()
        job = session.get(BatchJob, batch_id)
        return job if job is not None and job.team == team else None


def delete_job(engine: Engine, team: str, batch_id: str) -> bool | None:
    """Delete a team's finished job and its requests (Anthropic's delete; its output files, if
    any, stay); None: no such job, False: it is still running."""
    job = _owned(engine, BatchJob, team, batch_id)
    if job is None:
        return None
    if job.status in ACTIVE or job.status == "finalizing":
        return False
    with Session(engine) as session:
        session.execute(delete(BatchRequest).where(col(BatchRequest.batch_id) == batch_id))
        session.execute(delete(BatchJob).where(col(BatchJob.id) == batch_id))
        session.commit()
    return True


def outcomes(engine: Engine, batch_id: str) -> dict[str, int]:
    """How each of a job's requests stands: processing (not done), succeeded (a 2xx), canceled,
    expired, errored (the rest)."""
    done = BatchRequest.state == "done"
    ok = col(BatchRequest.status_code).between(200, 299)
    why = col(BatchRequest.error_code)
    with Session(engine) as session:
        rows = session.exec(
            select(done, ok, why, func.count())
            .where(BatchRequest.batch_id == batch_id)
            .group_by(done, ok, why)
        ).all()
    counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
    for finished, succeeded, code, n in rows:
        if not finished:
            counts["processing"] += n
        elif succeeded:
            counts["succeeded"] += n
        elif code == CANCELLED[0]:
            counts["canceled"] += n
        elif code == EXPIRED[0]:
            counts["expired"] += n
        else:
            counts["errored"] += n
    return counts


def requests_of(engine: Engine, batch_id: str) -> list[BatchRequest]:
    """A job's requests in their input's order, as they ended."""
    with Session(engine) as session:
        query = select(BatchRequest).where(BatchRequest.batch_id == batch_id)
        return list(session.exec(query.order_by(col(BatchRequest.line))))


def progress(engine: Engine, batch_id: str) -> tuple[int, int]:
    """(completed, failed) so far: requests answered with a 2xx, and the other finished ones."""
    with Session(engine) as session:
        ok = col(BatchRequest.status_code).between(200, 299)
        rows = session.exec(
            select(ok, func.count())
            .where(BatchRequest.batch_id == batch_id, BatchRequest.state == "done")
            .group_by(ok)
        ).all()
    counts = {bool(k): n for k, n in rows}
    return counts.get(True, 0), counts.get(False, 0)


def batch_object(job: BatchJob, counts: tuple[int, int] | None = None) -> dict[str, Any]:
    """OpenAI's batch object. `counts`: (completed, failed) so far, for a job still running."""
    completed, failed = counts if counts is not None else (job.completed, job.failed)
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "errors": None,
        "input_file_id": job.input_file_id,
        "completion_window": job.completion_window,
        "status": job.status,
        "output_file_id": job.output_file_id,
        "error_file_id": job.error_file_id,
        "created_at": job.created_at,
        "in_progress_at": job.in_progress_at,
        "expires_at": job.expires_at,
        "finalizing_at": job.finalizing_at,
        "completed_at": job.completed_at,
        "failed_at": job.failed_at,
        "expired_at": job.expired_at,
        "cancelling_at": job.cancelling_at,
        "cancelled_at": job.cancelled_at,
        "request_counts": {"total": job.total, "completed": completed, "failed": failed},
        "metadata": msgspec.json.decode(job.metadata_json),
    }


def file_object(row: BatchFile) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": row.created_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }
