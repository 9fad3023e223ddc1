"""A batch job's life as the worker drives it, in SQL (synchronous: the worker runs these in a
thread): requests leased, renewed, finished or released; jobs cancelled or expired, finalized into
their output files, and their callbacks claimed.

Claims are conditional UPDATEs checked by row count, so any number of gateway processes sharing the
database never run one request twice; finalizing is claimed the same way, in the transaction that
writes the output files, so a job is finalized exactly once.
"""

import time
from dataclasses import dataclass

from sqlalchemy import Engine, func, update
from sqlmodel import Session, col, select

from tokenyard.batch.files import output_line
from tokenyard.batch.jobs import ACTIVE, CANCELLED, EXPIRED, new_id
from tokenyard.batch.models import BatchFile, BatchJob, BatchRequest
from tokenyard.tenancy import events


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
        events.add(session, job.team, f"batch.{job.status}", job.id)  # OpenAI's batch.* events
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
