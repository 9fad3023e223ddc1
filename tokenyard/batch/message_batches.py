"""Anthropic's Message Batches API (`/v1/messages/batches`) over the batch tier: the same jobs,
worker, quotas and billing as OpenAI's Batches, for Anthropic's clients unchanged.

Each request's `params` (a Messages request) is translated onto a chat completion as
`POST /v1/messages` does (backends/anthropic_messages.py) and runs on the batch tier; a request
whose params do not translate is an errored result, not a refused batch, as at Anthropic. Results
come back as Anthropic's JSONL: succeeded with the Message, errored with Anthropic's error body,
canceled or expired. A job made here has an id of its own shape (`msgbatch_…`) and is listed here
only; every refusal leaves in Anthropic's error shape. A team sees only its own batches.
"""

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from tokenyard.backends.anthropic_messages import (
    chat_request,
    error_body,
    error_from_openai,
    message_reply,
)
from tokenyard.batch import jobs
from tokenyard.batch.files import Line
from tokenyard.batch.models import BatchJob, BatchRequest
from tokenyard.batch.worker import BatchWorker
from tokenyard.core.errors import GatewayError
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.scopes import check_scope
from tokenyard.gateway.validation import query_int
from tokenyard.tenancy.policy import TeamPolicy

CHAT = "/v1/chat/completions"
_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # Anthropic's rule for a request's custom_id
_ENDED = ("completed", "failed", "expired", "cancelled")


class _Item(msgspec.Struct, forbid_unknown_fields=True):
    custom_id: str
    params: dict[str, Any]


class CreateMessageBatch(msgspec.Struct, forbid_unknown_fields=True):
    requests: list[_Item]


def _time(seconds: int | None) -> str | None:
    """Anthropic's times are RFC 3339 strings."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def message_batch(job: BatchJob, counts: dict[str, int]) -> dict[str, Any]:
    ended = job.status in _ENDED
    status = "ended" if ended else "canceling" if job.status == "cancelling" else "in_progress"
    ended_at = job.completed_at or job.failed_at or job.expired_at or job.cancelled_at
    return {
        "id": job.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": counts,
        "ended_at": _time(ended_at if ended else None),
        "created_at": _time(job.created_at),
        "expires_at": _time(job.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _time(job.cancelling_at),
        # relative: the client joins it to the base URL it reached the gateway by
        "results_url": f"/v1/messages/batches/{job.id}/results" if ended else None,
    }


def _line(item: _Item, seen: set[str]) -> Line:
    """One request as the batch tier runs it: its chat body, or why it cannot run."""
    if item.custom_id in seen:
        return Line(item.custom_id, b"", ("invalid_request_error", "custom_id repeats"))
    seen.add(item.custom_id)
    try:
        chat = chat_request({**item.params, "stream": False})
    except GatewayError as exc:
        return Line(item.custom_id, b"", ("invalid_request_error", exc.message))
    chat.pop("stream", None)
    return Line(item.custom_id, msgspec.json.encode(chat))


def _lines(raw: bytes, cap: int) -> list[Line]:
    """The batch's requests, checked (in a thread: a large batch would hold the event loop)."""
    try:
        ask = msgspec.json.decode(raw, type=CreateMessageBatch)
    except msgspec.ValidationError as exc:
        raise GatewayError(400, f"invalid request: {exc}", param="requests") from None
    except msgspec.DecodeError as exc:
        raise GatewayError(400, f"the body is not valid JSON: {exc}") from None
    if not 0 < len(ask.requests) <= cap:
        raise GatewayError(400, f"requests: 1 to {cap} are allowed", param="requests")
    for item in ask.requests:
        if not _CUSTOM_ID.fullmatch(item.custom_id):
            why = "custom_id must be 1 to 64 letters, digits, '_' or '-'"
            raise GatewayError(400, f"requests: {why}", param="requests")
    seen: set[str] = set()
    return [_line(item, seen) for item in ask.requests]


def _result(row: BatchRequest) -> dict[str, Any]:
    """One request's line of the results file."""
    if row.error_code == jobs.CANCELLED[0]:
        result: dict[str, Any] = {"type": "canceled"}
    elif row.error_code == jobs.EXPIRED[0]:
        result = {"type": "expired"}
    elif row.status_code is not None and 200 <= row.status_code < 300 and row.response:
        reply = msgspec.json.decode(row.response)
        result = {"type": "succeeded", "message": message_reply(reply, str(reply.get("model")))}
    elif row.status_code is not None and row.response is not None:
        result = {"type": "errored", "error": error_from_openai(row.status_code, row.response)}
    else:
        status = 400 if row.error_code == "invalid_request_error" else 500
        message = row.error_message or "the request did not run"
        result = {"type": "errored", "error": error_body(status, message)}
    return {"custom_id": row.custom_id, "result": result}


def _json(data: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(data), media_type="application/json")


async def _answer(
    request: Request, proxy: Proxy, work: Callable[[TeamPolicy], Awaitable[Response[bytes]]]
) -> Response[bytes]:
    """Authenticate as Anthropic's clients do (x-api-key or bearer), do the work, and answer any
    refusal in Anthropic's error shape."""
    try:
        policy = await proxy.auth.caller(request)
        return await work(policy)
    except GatewayError as exc:
        body = msgspec.json.encode(error_body(exc.status, exc.message))
        return Response(
            body, status_code=exc.status, media_type="application/json", headers=exc.headers()
        )


async def _owned_job(worker: BatchWorker, team: str, batch_id: str) -> BatchJob:
    job = None
    if batch_id.startswith(jobs.ANTHROPIC_JOB):
        job = await anyio.to_thread.run_sync(jobs.get_job, worker.sql, team, batch_id)
    if job is None:
        raise GatewayError(404, f"no message batch {batch_id!r}")
    return job


async def _batch(worker: BatchWorker, job: BatchJob) -> Response[bytes]:
    counts = await anyio.to_thread.run_sync(jobs.outcomes, worker.sql, job.id)
    return _json(message_batch(job, counts))


class MessageBatchesController(Controller):
    path = "/v1/messages/batches"

    @post("", status_code=200)
    async def create(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            check_scope(policy, CHAT, doing="run a batch of")
            cap = batch_worker.settings.batch_max_requests
            lines = await anyio.to_thread.run_sync(_lines, await request.body(), cap)
            window_s = batch_worker.settings.batch_window_s or 86400.0
            job = await anyio.to_thread.run_sync(
                lambda: jobs.create_job(
                    batch_worker.sql,
                    team=policy.team,
                    key_prefix=policy.key_prefix,
                    endpoint=CHAT,
                    lines=lines,
                    window_s=window_s,
                    id_prefix=jobs.ANTHROPIC_JOB,
                )
            )
            return await _batch(batch_worker, job)

        return await _answer(request, proxy, work)

    @get("")
    async def list_batches(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            q = request.query_params
            limit = query_int(q, "limit", 1, 1000, 20)
            found = await anyio.to_thread.run_sync(
                lambda: jobs.list_jobs(
                    batch_worker.sql,
                    policy.team,
                    q.get("after_id"),
                    limit + 1,
                    jobs.ANTHROPIC_JOB,
                    q.get("before_id"),
                )
            )
            page = found[:limit] if q.get("before_id") is None else found[-limit:]
            data = await anyio.to_thread.run_sync(
                lambda: [message_batch(j, jobs.outcomes(batch_worker.sql, j.id)) for j in page]
            )
            return _json(
                {
                    "data": data,
                    "has_more": len(found) > limit,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None,
                }
            )

        return await _answer(request, proxy, work)

    @get("/{batch_id:str}")
    async def retrieve(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            return await _batch(batch_worker, await _owned_job(batch_worker, policy.team, batch_id))

        return await _answer(request, proxy, work)

    @post("/{batch_id:str}/cancel", status_code=200)
    async def cancel(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            await _owned_job(batch_worker, policy.team, batch_id)
            job = await anyio.to_thread.run_sync(
                jobs.cancel_job, batch_worker.sql, policy.team, batch_id
            )
            assert job is not None  # it was the team's a moment ago; jobs are never re-owned
            return await _batch(batch_worker, job)

        return await _answer(request, proxy, work)

    @get("/{batch_id:str}/results")
    async def results(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            job = await _owned_job(batch_worker, policy.team, batch_id)
            if job.status not in _ENDED:
                raise GatewayError(404, f"message batch {batch_id!r} has not ended yet")
            rows = await anyio.to_thread.run_sync(jobs.requests_of, batch_worker.sql, job.id)
            body = b"".join(msgspec.json.encode(_result(row)) + b"\n" for row in rows)
            return Response(body, media_type="application/x-jsonl")

        return await _answer(request, proxy, work)

    @delete("/{batch_id:str}", status_code=200)
    async def remove(
        self,
        request: Request,
        proxy: NamedDependency[Proxy],
        batch_worker: NamedDependency[BatchWorker],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        async def work(policy: TeamPolicy) -> Response[bytes]:
            await _owned_job(batch_worker, policy.team, batch_id)
            done = await anyio.to_thread.run_sync(
                jobs.delete_job, batch_worker.sql, policy.team, batch_id
            )
            if not done:
                why = "a message batch can be deleted once it has ended: cancel it first"
                raise GatewayError(400, why)
            return _json({"id": batch_id, "type": "message_batch_deleted"})

        return await _answer(request, proxy, work)
