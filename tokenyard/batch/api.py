"""OpenAI's Files and Batches routes (/v1/files, /v1/batches) and the inline form (/v1/batch).

A team sees only its own files and jobs: anything else answers 404, exactly as a missing id does.
"""

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

import anyio
import msgspec
from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from sqlalchemy import Engine

from tokenyard.batch import jobs
from tokenyard.batch.files import (
    ENDPOINTS,
    UNREADABLE,
    Line,
    check_items,
    count_lines,
    is_plain,
    parse_lines,
)
from tokenyard.batch.models import BatchFile, BatchJob
from tokenyard.batch.worker import BatchWorker
from tokenyard.core.destinations import Network, RefusedDestination, check
from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import body_operation, json_body
from tokenyard.gateway.scopes import check_scope
from tokenyard.gateway.validation import Metadata
from tokenyard.tenancy import teams, webhook_secrets
from tokenyard.tenancy.errors import ManagementError, OperatorsChoice
from tokenyard.tenancy.models import Team
from tokenyard.tenancy.policy import TeamPolicy

T = TypeVar("T")
WINDOW = "24h"  # the one completion window OpenAI offers
MAX_PRIORITY = 100  # an inline job's priority is within ±this (SQL's column is 32-bit)
_MAX_FILENAME = 255
# the field msgspec's validation message names: "… at `$.priority`", "… required field `endpoint`"
_FIELD = re.compile(r"`\$\.(\w+)|required field `(\w+)`")


class CreateBatch(msgspec.Struct):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None


class InlineBatch(msgspec.Struct):
    requests: list[msgspec.Raw]  # decoded one by one (batch/files.py check_items)
    endpoint: str = "/v1/chat/completions"
    callback_url: Annotated[str, msgspec.Meta(max_length=2048)] | None = None
    # orders the team's own batch jobs: higher runs first
    priority: Annotated[int, msgspec.Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    completion_window: str = WINDOW
    metadata: Metadata | None = None


# the upload's multipart form, for the OpenAPI document (the handler reads the form itself)
_UPLOAD = {
    "type": "object",
    "required": ["purpose", "file"],
    "properties": {
        "purpose": {"type": "string", "enum": ["batch"]},
        "file": {"type": "string", "format": "binary"},
    },
}


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def _decode(raw: bytes, struct: type[T]) -> T:
    try:
        return msgspec.json.decode(raw, type=struct)
    except msgspec.ValidationError as exc:
        field = _FIELD.search(str(exc))
        param = (field[1] or field[2]) if field else None
        raise GatewayError(400, str(exc), code="invalid_request", param=param) from None
    except UNREADABLE as exc:
        raise GatewayError(400, f"body is not valid JSON: {exc}", code="invalid_json") from None


def _check_job(endpoint: str, window: str, caller: TeamPolicy) -> None:
    if endpoint not in ENDPOINTS:
        raise GatewayError(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    # a key restricted to batches runs only the kinds of request it may send itself
    check_scope(caller, endpoint, doing="run a batch of", param="endpoint")
    if window != WINDOW:
        raise GatewayError(400, f"completion_window must be {WINDOW!r}", param="completion_window")


def _check_count(count: int, cap: int, param: str) -> None:
    if count > cap:
        raise GatewayError(400, f"at most {cap} requests in one batch, not {count}", param=param)


def _check_upload(content: bytes, cap: int) -> None:
    try:
        content.decode()
    except UnicodeDecodeError:
        raise GatewayError(400, "the file must be UTF-8 JSONL", param="file") from None
    _check_count(count_lines(content), cap, "file")


def _inline_job(raw: bytes, cap: int, caller: TeamPolicy) -> tuple[InlineBatch, list[Line]]:
    """The inline form's body, decoded and its requests checked (run in a thread: thousands of
    requests would hold the event loop, and every other request, for a while)."""
    ask = _decode(raw, InlineBatch)
    _check_job(ask.endpoint, ask.completion_window, caller)
    if not ask.requests:
        raise GatewayError(400, "'requests' must be a non-empty array", param="requests")
    _check_count(len(ask.requests), cap, "requests")
    return ask, check_items(ask.requests, ask.endpoint)


async def _check_callback(url: str, allow: Sequence[Network], param: str = "callback_url") -> None:
    """A receiver a team chose: public addresses only, or the operator's allowed networks."""
    try:
        await check(url, allow)
    except RefusedDestination as exc:
        raise GatewayError(400, f"{param} refused: {exc}", param=param) from None
    except OSError:  # did not resolve: said as a refusal is, not to tell which names exist
        why = f"{param} refused: its host must resolve to public addresses only"
        raise GatewayError(400, why, param=param) from None


class SetWebhook(msgspec.Struct, forbid_unknown_fields=True):
    url: Annotated[str, msgspec.Meta(max_length=2048)] | None  # None: no receiver


def _webhook_object(team: Team) -> Response[bytes]:
    set_by = (
        None if team.webhook_url is None else "team" if team.webhook_url_by_team else "operator"
    )
    return _json({"object": "batch.webhook_url", "url": team.webhook_url, "set_by": set_by})


def _list_page(data: list[dict[str, Any]], has_more: bool) -> Response[bytes]:
    """OpenAI's cursor-paginated list; `limit + 1` rows were read to tell `has_more`."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    page = {"object": "list", "data": data, "first_id": first, "last_id": last}
    return _json({**page, "has_more": has_more})


def _not_found(what: str, ident: str) -> GatewayError:
    return GatewayError(404, f"no {what} {ident!r}", code=f"{what}_not_found")


async def _callers_job(
    engine: Engine,
    team: str,
    action: Callable[[Engine, str, str], BatchJob | None],
    batch_id: str,
) -> Response[bytes]:
    """`action` on the calling team's job (read it, cancel it) → the batch object; another
    team's job answers 404 like one that never existed."""
    job = await anyio.to_thread.run_sync(action, engine, team, batch_id)
    if job is None:
        raise _not_found("batch", batch_id)
    return _json(await _batch_object(engine, job))


async def _callers_file(engine: Engine, team: str, file_id: str) -> BatchFile:
    """The calling team's file; another team's answers 404 like one that never existed."""
    row = await anyio.to_thread.run_sync(jobs.get_file, engine, team, file_id)
    if row is None:
        raise _not_found("file", file_id)
    return row


async def _webhook_secret(
    engine: Engine, team: str, action: Callable[[Engine, str], str | None]
) -> Response[bytes]:
    secret = await anyio.to_thread.run_sync(action, engine, team)
    if secret is None:  # the team is gone; its key was still cached
        raise _not_found("team", team)
    return _json({"object": "batch.webhook_secret", "secret": secret})


async def _batch_object(engine: Engine, job: jobs.BatchJob) -> dict[str, Any]:
    """The batch object; a running job's request counts are read live."""
    counts = await anyio.to_thread.run_sync(jobs.progress, engine, job.id)
    return jobs.batch_object(job, counts if job.status in jobs.ACTIVE else None)


async def _create(
    worker: BatchWorker, policy: TeamPolicy, lines: list[Line], **job: Any
) -> jobs.BatchJob:
    window_s = worker.settings.batch_window_s or 86400.0
    return await anyio.to_thread.run_sync(
        lambda: jobs.create_job(
            worker.sql,
            team=policy.team,
            key_prefix=policy.key_prefix,
            lines=lines,
            window_s=window_s,
            **job,
        )
    )


class FilesController(Controller):
    path = "/v1/files"

    @post("/", status_code=200, operation_class=body_operation("multipart/form-data", _UPLOAD))
    async def upload(
        self,
        request: Request,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        try:
            form = await request.form()
        except UnicodeDecodeError:  # a text field that is not UTF-8 (Litestar decodes them)
            raise GatewayError(400, "the form's fields must be UTF-8") from None
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise GatewayError(400, "purpose must be 'batch'", param="purpose")
        if not isinstance(upload, UploadFile):
            raise GatewayError(400, "a JSONL file is required", param="file")
        filename = upload.filename or "batch.jsonl"
        if not is_plain(filename, _MAX_FILENAME):
            why = f"the file's name must be at most {_MAX_FILENAME} characters, no control ones"
            raise GatewayError(400, why, param="file")
        content = await upload.read()
        if not content.strip():
            raise GatewayError(400, "the file is empty", param="file")
        limit = batch_worker.settings.batch_max_requests
        await anyio.to_thread.run_sync(_check_upload, content, limit)
        row = await anyio.to_thread.run_sync(
            jobs.create_file, batch_worker.sql, caller.team, filename, purpose, content
        )
        return _json(jobs.file_object(row))

    @get("/")
    async def list_files(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        purpose: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
        limit: FromQuery[int] = 100,
    ) -> Response[bytes]:
        limit = max(1, min(limit, 10_000))
        found = await anyio.to_thread.run_sync(
            jobs.list_files, batch_worker.sql, caller.team, purpose, after, limit + 1
        )
        data = [jobs.file_object(row) for row in found[:limit]]
        return _list_page(data, has_more=len(found) > limit)

    @get("/{file_id:str}")
    async def retrieve(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        file_id: FromPath[str],
    ) -> Response[bytes]:
        return _json(jobs.file_object(await _callers_file(batch_worker.sql, caller.team, file_id)))

    @delete("/{file_id:str}", status_code=200)
    async def delete_file(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        file_id: FromPath[str],
    ) -> Response[bytes]:
        engine = batch_worker.sql
        if not await anyio.to_thread.run_sync(jobs.delete_file, engine, caller.team, file_id):
            raise _not_found("file", file_id)
        return _json({"id": file_id, "object": "file", "deleted": True})

    @get("/{file_id:str}/content")
    async def content(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        file_id: FromPath[str],
    ) -> Response[bytes]:
        row = await _callers_file(batch_worker.sql, caller.team, file_id)
        return Response(row.content, media_type="application/jsonl")


class BatchesController(Controller):
    path = "/v1"

    @post("/batches", status_code=200, operation_class=json_body(CreateBatch))
    async def create(
        self,
        request: Request,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        ask = _decode(await request.body(), CreateBatch)
        _check_job(ask.endpoint, ask.completion_window, caller)
        source = await anyio.to_thread.run_sync(
            jobs.get_file, batch_worker.sql, caller.team, ask.input_file_id
        )
        if source is None or source.purpose != "batch":
            raise GatewayError(
                404,
                f"no batch input file {ask.input_file_id!r}",
                code="file_not_found",
                param="input_file_id",
            )
        # in a thread, as the inline form's requests are (thousands of lines)
        lines = await anyio.to_thread.run_sync(parse_lines, source.content, ask.endpoint)
        _check_count(len(lines), batch_worker.settings.batch_max_requests, "input_file_id")
        job = await _create(
            batch_worker,
            caller,
            lines,
            endpoint=ask.endpoint,
            input_file_id=ask.input_file_id,
            metadata=ask.metadata,
        )
        return _json(await _batch_object(batch_worker.sql, job))

    @get("/batches")
    async def list_batches(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        after: FromQuery[str | None] = None,
        limit: FromQuery[int] = 20,
    ) -> Response[bytes]:
        limit = max(1, min(limit, 100))
        engine = batch_worker.sql
        found = await anyio.to_thread.run_sync(
            jobs.list_jobs, engine, caller.team, after, limit + 1
        )
        data = [await _batch_object(engine, job) for job in found[:limit]]
        return _list_page(data, has_more=len(found) > limit)

    @get("/batches/{batch_id:str}")
    async def retrieve(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        return await _callers_job(batch_worker.sql, caller.team, jobs.get_job, batch_id)

    @post("/batches/{batch_id:str}/cancel", status_code=200)
    async def cancel(
        self,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
        batch_id: FromPath[str],
    ) -> Response[bytes]:
        return await _callers_job(batch_worker.sql, caller.team, jobs.cancel_job, batch_id)

    @get("/batch/webhook_secret")
    async def webhook_secret(
        self, batch_worker: NamedDependency[BatchWorker], caller: NamedDependency[TeamPolicy]
    ) -> Response[bytes]:
        """The team's key for checking its callbacks' signatures, made on first use."""
        return await _webhook_secret(batch_worker.sql, caller.team, webhook_secrets.team_secret)

    @post("/batch/webhook_secret", status_code=200)
    async def rotate_webhook_secret(
        self, batch_worker: NamedDependency[BatchWorker], caller: NamedDependency[TeamPolicy]
    ) -> Response[bytes]:
        """A new key for the team: callbacks are signed with it from now on."""
        return await _webhook_secret(batch_worker.sql, caller.team, webhook_secrets.rotate_secret)

    @get("/batch/webhook_url")
    async def webhook_url(
        self, batch_worker: NamedDependency[BatchWorker], caller: NamedDependency[TeamPolicy]
    ) -> Response[bytes]:
        """Where the team's events go (a background response or a batch ended), and who set it."""
        team = await anyio.to_thread.run_sync(teams.get_team, batch_worker.sql, caller.team)
        if team is None:  # the team is gone; its key was still cached
            raise _not_found("team", caller.team)
        return _webhook_object(team)

    @post("/batch/webhook_url", status_code=200, operation_class=json_body(SetWebhook))
    async def set_webhook_url(
        self,
        request: Request,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The team's own receiver of its events (null: none): held to public addresses or the
        operator's allowed networks, as callbacks are, and never over the operator's own."""
        url = _decode(await request.body(), SetWebhook).url
        if url is not None:
            await _check_callback(url, batch_worker.callback_allow, "url")
        actor = f"team-api:{caller.key_prefix}"
        try:
            team = await anyio.to_thread.run_sync(
                lambda: teams.set_own_webhook(batch_worker.sql, caller.team, url, actor=actor)
            )
        except OperatorsChoice as exc:
            raise GatewayError(403, str(exc), code="set_by_operator", param="url") from None
        except ManagementError:  # the team is gone; its key was still cached
            raise _not_found("team", caller.team) from None
        return _webhook_object(team)

    @post("/batch", status_code=200, operation_class=json_body(InlineBatch))
    async def inline(
        self,
        request: Request,
        batch_worker: NamedDependency[BatchWorker],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The inline form: the requests in the body, an optional callback when the job ends."""
        raw = await request.body()
        ask, lines = await anyio.to_thread.run_sync(
            _inline_job, raw, batch_worker.settings.batch_max_requests, caller
        )
        if ask.callback_url is not None:
            await _check_callback(ask.callback_url, batch_worker.callback_allow)
        job = await _create(
            batch_worker,
            caller,
            lines,
            endpoint=ask.endpoint,
            metadata=ask.metadata,
            callback_url=ask.callback_url,
            priority=ask.priority,
        )
        waves = math.ceil(job.total / batch_worker.settings.batch_max_concurrency)
        estimate = time.time() + waves * batch_worker.seconds_per_request
        return _json(
            {
                "batch_id": job.id,
                "status": job.status,
                "estimated_completion": min(job.expires_at, math.ceil(estimate)),
            }
        )
