"""OpenAI's Files and Batches routes (/v1/files, /v1/batches) and the inline form (/v1/batch).

A team sees only its own files and jobs: anything else answers 404, exactly as a missing id does.
"""

import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.datastructures import UploadFile
from litestar.params import FromPath, FromQuery
from sqlalchemy import Engine

from batch import jobs
from batch.files import ENDPOINTS, Line, check_items, parse_lines
from batch.models import BatchFile, BatchJob
from batch.worker import BatchWorker
from billing.events import key_prefix
from gateway.errors import GatewayError
from gateway.keys import TeamPolicy

T = TypeVar("T")
WINDOW = "24h"  # the one completion window OpenAI offers
_MAX_METADATA = 16


class CreateBatch(msgspec.Struct):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class InlineBatch(msgspec.Struct):
    requests: list[Any]
    endpoint: str = "/v1/chat/completions"
    callback_url: str | None = None
    priority: int = 0  # among the team's batch jobs: higher runs first
    completion_window: str = WINDOW
    metadata: dict[str, str] | None = None


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def _worker(request: Request) -> BatchWorker:
    return request.app.state.batch_worker


async def _caller(request: Request) -> TeamPolicy:
    return await request.app.state.proxy.auth.authenticate(request.headers.get("authorization"))


def _decode(raw: bytes, struct: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=struct)
    except msgspec.ValidationError as exc:
        raise GatewayError(400, str(exc), code="invalid_request") from None
    except msgspec.DecodeError as exc:
        raise GatewayError(400, f"body is not valid JSON: {exc}", code="invalid_json") from None


def _check_job(endpoint: str, window: str, metadata: dict[str, str] | None) -> None:
    if endpoint not in ENDPOINTS:
        raise GatewayError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    if window != WINDOW:
        raise GatewayError(400, f"completion_window must be {WINDOW!r}", param="completion_window")
    if metadata and len(metadata) > _MAX_METADATA:
        raise GatewayError(400, f"at most {_MAX_METADATA} metadata pairs", param="metadata")


def _not_found(what: str, ident: str) -> GatewayError:
    return GatewayError(404, f"no {what} {ident!r}", code=f"{what}_not_found")


async def _callers_job(
    request: Request, action: Callable[[Engine, str, str], BatchJob | None], batch_id: str
) -> Response[bytes]:
    """`action` on the calling team's job (read it, cancel it) → the batch object; another
    team's job answers 404 like one that never existed."""
    policy = await _caller(request)
    job = await anyio.to_thread.run_sync(action, _worker(request).sql, policy.team, batch_id)
    if job is None:
        raise _not_found("batch", batch_id)
    return _json(await _batch_object(request, job))


async def _callers_file(request: Request, file_id: str) -> BatchFile:
    """The calling team's file; another team's answers 404 like one that never existed."""
    policy = await _caller(request)
    row = await anyio.to_thread.run_sync(jobs.get_file, _worker(request).sql, policy.team, file_id)
    if row is None:
        raise _not_found("file", file_id)
    return row


async def _batch_object(request: Request, job: jobs.BatchJob) -> dict[str, Any]:
    """The batch object; a running job's request counts are read live."""
    engine = _worker(request).sql
    counts = await anyio.to_thread.run_sync(jobs.progress, engine, job.id)
    return jobs.batch_object(job, counts if job.status in jobs.ACTIVE else None)


async def _create(
    request: Request, policy: TeamPolicy, lines: list[Line], **job: Any
) -> jobs.BatchJob:
    worker = _worker(request)
    window_s = worker.settings.batch_window_s or 86400.0
    return await anyio.to_thread.run_sync(
        lambda: jobs.create_job(
            worker.sql,
            team=policy.team,
            key_prefix=key_prefix(request.headers.get("authorization")),
            lines=lines,
            window_s=window_s,
            **job,
        )
    )


class FilesController(Controller):
    path = "/v1/files"

    @post("/", status_code=200)
    async def upload(self, request: Request) -> Response[bytes]:
        policy = await _caller(request)
        form = await request.form()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise GatewayError(400, "purpose must be 'batch'", param="purpose")
        if not isinstance(upload, UploadFile):
            raise GatewayError(400, "a JSONL file is required", param="file")
        content = await upload.read()
        if not content.strip():
            raise GatewayError(400, "the file is empty", param="file")
        engine = _worker(request).sql
        row = await anyio.to_thread.run_sync(
            jobs.create_file,
            engine,
            policy.team,
            upload.filename or "batch.jsonl",
            purpose,
            content,
        )
        return _json(jobs.file_object(row))

    @get("/{file_id:str}")
    async def retrieve(self, request: Request, file_id: FromPath[str]) -> Response[bytes]:
        return _json(jobs.file_object(await _callers_file(request, file_id)))

    @get("/{file_id:str}/content")
    async def content(self, request: Request, file_id: FromPath[str]) -> Response[bytes]:
        row = await _callers_file(request, file_id)
        return Response(row.content, media_type="application/jsonl")


class BatchesController(Controller):
    path = "/v1"

    @post("/batches", status_code=200)
    async def create(self, request: Request) -> Response[bytes]:
        policy = await _caller(request)
        ask = _decode(await request.body(), CreateBatch)
        _check_job(ask.endpoint, ask.completion_window, ask.metadata)
        engine = _worker(request).sql
        source = await anyio.to_thread.run_sync(
            jobs.get_file, engine, policy.team, ask.input_file_id
        )
        if source is None or source.purpose != "batch":
            raise GatewayError(
                404,
                f"no batch input file {ask.input_file_id!r}",
                code="file_not_found",
                param="input_file_id",
            )
        lines = parse_lines(source.content, ask.endpoint)
        job = await _create(
            request,
            policy,
            lines,
            endpoint=ask.endpoint,
            input_file_id=ask.input_file_id,
            metadata=ask.metadata,
        )
        return _json(await _batch_object(request, job))

    @get("/batches")
    async def list_batches(
        self, request: Request, after: FromQuery[str | None] = None, limit: FromQuery[int] = 20
    ) -> Response[bytes]:
        policy = await _caller(request)
        limit = max(1, min(limit, 100))
        found = await anyio.to_thread.run_sync(
            jobs.list_jobs, _worker(request).sql, policy.team, after, limit + 1
        )
        data = [await _batch_object(request, job) for job in found[:limit]]
        return _json(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(found) > limit,
            }
        )

    @get("/batches/{batch_id:str}")
    async def retrieve(self, request: Request, batch_id: FromPath[str]) -> Response[bytes]:
        return await _callers_job(request, jobs.get_job, batch_id)

    @post("/batches/{batch_id:str}/cancel", status_code=200)
    async def cancel(self, request: Request, batch_id: FromPath[str]) -> Response[bytes]:
        return await _callers_job(request, jobs.cancel_job, batch_id)

    @post("/batch", status_code=200)
    async def inline(self, request: Request) -> Response[bytes]:
        """The inline form: the requests in the body, an optional callback when the job ends."""
        policy = await _caller(request)
        ask = _decode(await request.body(), InlineBatch)
        _check_job(ask.endpoint, ask.completion_window, ask.metadata)
        if not ask.requests:
            raise GatewayError(400, "'requests' must be a non-empty array", param="requests")
        if ask.callback_url is not None and not ask.callback_url.startswith(
            ("http://", "https://")
        ):
            raise GatewayError(400, "callback_url must be an http(s) URL", param="callback_url")
        job = await _create(
            request,
            policy,
            check_items(ask.requests, ask.endpoint),
            endpoint=ask.endpoint,
            metadata=ask.metadata,
            callback_url=ask.callback_url,
            priority=ask.priority,
        )
        worker = _worker(request)
        waves = math.ceil(job.total / worker.settings.batch_max_concurrency)
        estimate = time.time() + waves * worker.seconds_per_request
        return _json(
            {
                "batch_id": job.id,
                "status": job.status,
                "estimated_completion": min(job.expires_at, math.ceil(estimate)),
            }
        )
