"""The batch tier's SQL operations (synchronous: the API and the worker run them in a thread).

Claims are conditional UPDATEs checked by row count, so any number of gateway processes sharing the
database never run one request twice; finalizing is claimed the same way, in the transaction that
writes the output files, so a job is finalized exactly once.
"""

import os
import re
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from sqlalchemy import Engine, delete, func, insert, update
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from batch.files import Line, output_line
from batch.models import BatchFile, BatchJob, BatchRequest

_Owned = TypeVar("_Owned", BatchFile, BatchJob)

ACTIVE = ("validating", "in_progress", "cancelling")  # not yet final
CANCELLED = ("batch_cancelled", "The batch was cancelled before this request ran.")
EXPIRED = (
    "batch_expired",
    "This request could not be executed before the completion window expired.",
)


# what new_id makes: a client's id of any other shape names nothing, and is never sent to SQL
# (PostgreSQL refuses a NUL in a parameter outright)
_ID = re.compile(r"(file-|batch_)[0-9a-f]{24}")
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
) -> BatchJob:
    """The job and its requests in one transaction: in progress at once (lines were checked).
    The requests go in as bulk INSERTs: a row object each took seconds for 10,000."""
    now = int(time.time())
    job = BatchJob(
        id=new_id("batch_"),
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
    engine: Engine, table: type[_Owned], team: str, after: str | None, limit: int, *where: Any
) -> list[_Owned]:
    """A team's rows, newest first, after the cursor row (OpenAI's `after` pagination). A cursor
    that is not one of the team's rows is ignored, another team's exactly as a missing one."""
    cursor = _owned(engine, table, team, after) if after else None
    with Session(engine) as session:
        query = select(table).where(table.team == team, *where)
        if cursor is not None:
            query = query.where(
                (col(table.created_at) < cursor.created_at)
                | ((table.created_at == cursor.created_at) & (col(table.id) < cursor.id))
            )
        if table is BatchFile:  # a listing never reads the files' contents
            query = query.options(defer(BatchFile.content))  # type: ignore[arg-type]
        query = query.order_by(col(table.created_at).desc(), col(table.id).desc())
        return list(session.exec(query.limit(limit)))


def list_jobs(engine: Engine, team: str, after: str | None, limit: int) -> list[BatchJob]:
    return _page(engine, BatchJob, team, after, limit)


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


@dataclass
class Claimed:
    """A request this process now holds the lease of, with what running it needs."""

    id: str
    batch_id: str
    team: str
    key_prefix: str
    endpoint: str
    body: bytes
    attempts: int


def claim(engine: Engine, owner: str, lease_s: float, limit: int) -> list[Claimed]:
    """Lease up to `limit` runnable requests: pending ones, and running ones whose holder's lease
    ran out (a dead gateway's). Teams take turns by job: each team's jobs are numbered in the
    team's own order (highest priority, then oldest); every team's first job comes before any
    team's second, and so on; in one turn, the older job first; a job's requests in line order.
    So priority orders a team's own jobs and never moves them ahead of another team's."""
    now = time.time()
    claimed: list[Claimed] = []
    # expire_on_commit=False: each claim compares the row's state and lease as selected; expiring
    # them at the first commit made the next candidate's check reload the row, so it matched a
    # claim another gateway had just made and took the request from it (run twice upstream)
    with Session(engine, expire_on_commit=False) as session:
        runnable = (
            (col(BatchRequest.state) == "pending") & (col(BatchRequest.not_before) <= now)
        ) | ((col(BatchRequest.state) == "running") & (col(BatchRequest.lease_until) < now))
        # numbered over jobs, not requests: the jobs are few, the requests may be 100,000s
        turn = func.row_number().over(
            partition_by=BatchJob.team,
            order_by=(col(BatchJob.priority).desc(), col(BatchJob.created_at), col(BatchJob.id)),
        )
        turns = (
            select(col(BatchJob.id).label("id"), turn.label("turn"))
            .where(BatchJob.status == "in_progress", BatchJob.expires_at > now)
            .subquery()
        )
        candidates = session.exec(
            select(BatchRequest, BatchJob)
            .join(BatchJob, col(BatchJob.id) == BatchRequest.batch_id)
            .join(turns, turns.c.id == BatchJob.id)
            .where(runnable)
            .order_by(
                turns.c.turn, col(BatchJob.created_at), col(BatchJob.id), col(BatchRequest.line)
            )
            .limit(limit)
        ).all()
        for row, job in candidates:
            took = session.exec(
                update(BatchRequest)  # type: ignore[call-overload]
                .where(
                    col(BatchRequest.id) == row.id,
                    col(BatchRequest.state) == row.state,
                    col(BatchRequest.lease_until) == row.lease_until,
                )
                .values(
                    state="running",
                    lease_owner=owner,
                    lease_until=now + lease_s,
                    attempts=row.attempts + 1,
                )
            )
            session.commit()
            if took.rowcount == 1:
                claimed.append(
                    Claimed(
                        row.id,
                        job.id,
                        job.team,
                        job.key_prefix,
                        job.endpoint,
                        row.body,
                        row.attempts + 1,
                    )
                )
    return claimed


def renew(engine: Engine, owner: str, ids: list[str], lease_s: float) -> None:
    if not ids:
        return
    with Session(engine) as session:
        session.exec(
            update(BatchRequest)  # type: ignore[call-overload]
            .where(
                col(BatchRequest.id).in_(ids),
                col(BatchRequest.lease_owner) == owner,
                col(BatchRequest.state) == "running",
            )
            .values(lease_until=time.time() + lease_s)
        )
        session.commit()


def finish(
    engine: Engine,
    owner: str,
    request_id: str,
    *,
    status_code: int | None = None,
    upstream_request_id: str | None = None,
    response: bytes | None = None,
    error: tuple[str, str] | None = None,
) -> None:
    """Record a request's outcome, if this process still holds it."""
    code, message = error or (None, None)
    with Session(engine) as session:
        session.exec(
            update(BatchRequest)  # type: ignore[call-overload]
            .where(
                col(BatchRequest.id) == request_id,
                col(BatchRequest.lease_owner) == owner,
                col(BatchRequest.state) == "running",
            )
            .values(
                state="done",
                status_code=status_code,
                request_id=upstream_request_id,
                response=response,
                error_code=code,
                error_message=message,
            )
        )
        session.commit()


def release(engine: Engine, owner: str, request_id: str, not_before: float) -> None:
    """Give a request back (refused by a quota, or this process stopping): retried later."""
    with Session(engine) as session:
        session.exec(
            update(BatchRequest)  # type: ignore[call-overload]
            .where(
                col(BatchRequest.id) == request_id,
                col(BatchRequest.lease_owner) == owner,
                col(BatchRequest.state) == "running",
            )
            .values(state="pending", lease_owner=None, lease_until=0.0, not_before=not_before)
        )
        session.commit()


def stopping_jobs(engine: Engine) -> dict[str, tuple[str, str]]:
    """Jobs being cancelled or past their window, with the error their unfinished requests get."""
    now = time.time()
    with Session(engine) as session:
        rows = session.exec(
            select(BatchJob.id, BatchJob.status).where(
                (col(BatchJob.status) == "cancelling")
                | ((col(BatchJob.status) == "in_progress") & (col(BatchJob.expires_at) <= now))
            )
        ).all()
    return {job_id: CANCELLED if status == "cancelling" else EXPIRED for job_id, status in rows}


def abandon(engine: Engine, batch_id: str, error: tuple[str, str]) -> None:
    """A stopping job's requests that are not running (or whose holder died) end with `error`."""
    now = time.time()
    with Session(engine) as session:
        session.exec(
            update(BatchRequest)  # type: ignore[call-overload]
            .where(
                col(BatchRequest.batch_id) == batch_id,
                (col(BatchRequest.state) == "pending")
                | ((col(BatchRequest.state) == "running") & (col(BatchRequest.lease_until) < now)),
            )
            .values(state="done", error_code=error[0], error_message=error[1])
        )
        session.commit()


def finishable_jobs(engine: Engine) -> list[str]:
    """Active jobs with no request left pending or running."""
    with Session(engine) as session:
        unfinished = (
            select(BatchRequest.id)
            .where(BatchRequest.batch_id == BatchJob.id, BatchRequest.state != "done")
            .exists()
        )
        return list(
            session.exec(select(BatchJob.id).where(col(BatchJob.status).in_(ACTIVE), ~unfinished))
        )


def finalize(engine: Engine, batch_id: str) -> BatchJob | None:
    """Write the output and error files and end the job: completed, or cancelled / expired for a
    job stopped early. None when another process finalized it, or it still has work."""
    now = int(time.time())
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(BatchJob, batch_id)
        if job is None or job.status not in ACTIVE:
            return None
        was = job.status
        took = session.exec(
            update(BatchJob)  # type: ignore[call-overload]
            .where(col(BatchJob.id) == batch_id, col(BatchJob.status) == was)
            .values(status="finalizing", finalizing_at=now)
        )
        if took.rowcount != 1:
            return None
        # columns, not row objects: a job's thousands of ORM instances (state, identity map) made
        # the garbage collector pause every thread, the event loop's too, again and again
        rows = session.exec(
            select(
                BatchRequest.id,
                BatchRequest.custom_id,
                BatchRequest.state,
                BatchRequest.status_code,
                BatchRequest.request_id,
                BatchRequest.response,
                BatchRequest.error_code,
                BatchRequest.error_message,
            )
            .where(BatchRequest.batch_id == batch_id)
            .order_by(col(BatchRequest.line))
        ).all()
        if any(r.state != "done" for r in rows):
            session.rollback()
            return None
        out: list[bytes] = []
        err: list[bytes] = []
        for r in rows:
            error = (r.error_code, r.error_message or "") if r.error_code else None
            line = output_line(r.id, r.custom_id, r.status_code, r.request_id, r.response, error)
            ok = r.status_code is not None and 200 <= r.status_code < 300
            (out if ok else err).append(line + b"\n")
        for lines, attr in ((out, "output_file_id"), (err, "error_file_id")):
            if lines:
                content = b"".join(lines)
                produced = BatchFile(
                    id=new_id("file-"),
                    team=job.team,
                    filename=f"{batch_id}_{attr.removesuffix('_file_id')}.jsonl",
                    purpose="batch_output",
                    bytes=len(content),
                    created_at=now,
                    content=content,
                )
                session.add(produced)
                setattr(job, attr, produced.id)
        job.completed, job.failed = len(out), len(err)
        if was == "cancelling":
            job.status, job.cancelled_at = "cancelled", now
        elif any(r.error_code == EXPIRED[0] for r in rows):  # else all ran, if only just
            job.status, job.expired_at = "expired", now
        else:
            job.status, job.completed_at = "completed", now
        job.finalizing_at = now
        if job.callback_url:
            job.callback_state = "pending"
        session.add(job)
        session.commit()
        return job


def claim_callback(engine: Engine, lease_s: float) -> BatchJob | None:
    """A finished job whose callback is due and not being delivered by another process."""
    now = time.time()
    with Session(engine, expire_on_commit=False) as session:
        job = session.exec(
            select(BatchJob).where(
                BatchJob.callback_state == "pending", BatchJob.callback_lease_until < now
            )
        ).first()
        if job is None:
            return None
        took = session.exec(
            update(BatchJob)  # type: ignore[call-overload]
            .where(
                col(BatchJob.id) == job.id,
                col(BatchJob.callback_lease_until) == job.callback_lease_until,
            )
            .values(callback_lease_until=now + lease_s)
        )
        session.commit()
        return job if took.rowcount == 1 else None


def callback_done(engine: Engine, batch_id: str, delivered: bool) -> None:
    with Session(engine) as session:
        session.exec(
            update(BatchJob)  # type: ignore[call-overload]
            .where(col(BatchJob.id) == batch_id)
            .values(callback_state="delivered" if delivered else "failed")
        )
        session.commit()


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
