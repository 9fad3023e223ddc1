"""`GET /v1/usage`: the calling team's usage from the daily rollups (a team sees only its own);
`GET /v1/admin/usage`: every team's, for the admin key. `?date=YYYY-MM-DD[&end=YYYY-MM-DD]` (UTC,
inclusive; default today), `&format=csv` for a CSV export of the rollups. JSON also has each API
key's totals over the range (`keys`, by prefix). `GET /v1/usage/users` (and `/v1/admin/usage/users`,
`&team=` optional): the end users' totals over the same range, dearest first (`&limit=`, default
100, at most 1000); `GET /v1/usage/metadata?key=K` (and the admin one): the same for each value the
requests' `metadata` gave K. `GET /v1/usage/alerts` (and the admin one): the budget alerts recorded
over the range, newest first; `GET /v1/usage/events` (and the admin one): the team's webhook
events (tenancy/events.py), each with whether its receiver took it. `GET /v1/usage/requests` (and
the admin one): each request's record, newest first (`&model=`, `&key=`, `&user=`, `&request_id=`,
`&status=error`, `&before=` an entry's id, `&limit=`)."""

import asyncio
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import msgspec
from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from sqlalchemy.exc import SQLAlchemyError

from tokenyard.billing import alerts, reports, request_log
from tokenyard.core.db import database_url, get_engine
from tokenyard.core.errors import GatewayError
from tokenyard.core.operator_keys import require_admin
from tokenyard.core.settings import Settings
from tokenyard.gateway.validation import query_int
from tokenyard.tenancy import events
from tokenyard.tenancy.policy import TeamPolicy

MAX_DAYS = 366
MAX_ROWS = 1000  # of a list by end user or by metadata value
MAX_METADATA_KEY = 64  # OpenAI's bound on a metadata key
_T = TypeVar("_T")


def _date(raw: str | None, param: str, default: date) -> date:
    if not raw:
        return default
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise GatewayError(400, f"{param} must be YYYY-MM-DD", param=param) from None


def _range(request: Request) -> tuple[date, date]:
    start = _date(request.query_params.get("date"), "date", datetime.now(UTC).date())
    end = _date(request.query_params.get("end"), "end", start)
    if end < start:
        raise GatewayError(400, "end is before date", param="end")
    if (end - start).days >= MAX_DAYS:
        raise GatewayError(400, f"a range spans at most {MAX_DAYS} days", param="end")
    return start, end


async def _read(settings: Settings, read: Callable[..., _T], *args: Any) -> _T:
    engine = get_engine(database_url(settings))
    try:  # a thread: SQL must never block the event loop that serves completions
        return await asyncio.to_thread(read, engine, *args)
    except SQLAlchemyError:
        raise GatewayError(
            503, "usage store unavailable", code="usage_store_unavailable", retry_after=1
        ) from None


async def _answer(
    request: Request, settings: Settings, team: str | None, head: dict[str, Any]
) -> Response[bytes]:
    """The range's rollups as CSV, or as JSON under `head` with each key's totals."""
    start, end = _range(request)
    fmt = request.query_params.get("format", "json")
    if fmt not in ("json", "csv"):
        raise GatewayError(400, "format must be json or csv", param="format")
    rows = await _read(settings, reports.daily, start, end, team)
    if fmt == "csv":
        return Response(reports.to_csv(rows).encode(), media_type="text/csv; charset=utf-8")
    body = head | {"date": start.isoformat(), "end": end.isoformat()} | reports.summary(rows)
    body["keys"] = await _read(settings, reports.by_key, start, end, team)
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _listed(
    request: Request,
    settings: Settings,
    team: str | None,
    read: Callable[..., list[dict[str, Any]]],
    *args: Any,
    head: dict[str, Any] | None = None,
) -> Response[bytes]:
    """A list of `read`'s rows over the request's range (`read(engine, start, end, team, *args,
    limit)`), at most `limit` of them, and whether more follow."""
    start, end = _range(request)
    limit = query_int(request.query_params, "limit", 1, MAX_ROWS, 100)
    # one more than asked: whether the list goes on
    rows = await _read(settings, read, start, end, team, *args, limit + 1)
    body = {
        "object": "list",
        "team": team,
        **(head or {}),
        "date": start.isoformat(),
        "end": end.isoformat(),
        "data": rows[:limit],
        "has_more": len(rows) > limit,
    }
    return Response(msgspec.json.encode(body), media_type="application/json")


async def _by_metadata(request: Request, settings: Settings, team: str | None) -> Response[bytes]:
    key = request.query_params.get("key") or ""
    if not 1 <= len(key) <= MAX_METADATA_KEY:
        raise GatewayError(400, f"key must be 1 to {MAX_METADATA_KEY} characters", param="key")
    try:
        return await _listed(request, settings, team, reports.by_metadata, key, head={"key": key})
    except ValueError as exc:  # a key the report cannot name
        raise GatewayError(400, str(exc), param="key") from None


async def _requests(request: Request, settings: Settings, team: str | None) -> Response[bytes]:
    """The request log (billing/request_log.py): newest first, `before` an entry's id to page."""
    q = request.query_params
    errors = q.get("status", "any")
    if errors not in ("any", "error"):
        raise GatewayError(400, "status must be any or error", param="status")
    filters = request_log.Filters(
        model=q.get("model") or None,
        key_prefix=q.get("key") or None,
        end_user=q.get("user") or None,
        request_id=q.get("request_id") or None,
        errors=errors == "error",
    )
    limit = query_int(request.query_params, "limit", 1, MAX_ROWS, 100)
    before = query_int(request.query_params, "before", 1, 2**63 - 1, None)
    rows = await _read(settings, request_log.recent, team, filters, limit + 1, before)
    body = {"object": "list", "team": team, "data": rows[:limit], "has_more": len(rows) > limit}
    return Response(msgspec.json.encode(body), media_type="application/json")


def _admin_team(request: Request, settings: Settings) -> str | None:
    """The admin key checked; the team asked for (`team=`), or None: every team."""
    require_admin(request.headers.get("authorization"), settings)
    return request.query_params.get("team") or None


class UsageController(Controller):
    path = "/v1"

    @get("/usage")
    async def usage(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        limits = msgspec.to_builtins(caller)
        del limits["blocked_users"]  # not a limit, and up to thousands of names
        head = {"object": "usage", "team": caller.team, "limits": limits}
        return await _answer(request, settings, caller.team, head)

    @get("/usage/users")
    async def end_users(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The calling team's end users (each request's `safety_identifier` or `user`)."""
        return await _listed(request, settings, caller.team, reports.by_end_user)

    @get("/usage/metadata")
    async def by_metadata(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The calling team's spend by each value of one key of its requests' `metadata`."""
        return await _by_metadata(request, settings, caller.team)

    @get("/admin/usage/metadata")
    async def admin_by_metadata(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        return await _by_metadata(request, settings, _admin_team(request, settings))

    @get("/usage/requests")
    async def requests(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The calling team's requests, each as its usage record has it, newest first."""
        return await _requests(request, settings, caller.team)

    @get("/admin/usage/requests")
    async def admin_requests(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        return await _requests(request, settings, _admin_team(request, settings))

    @get("/usage/alerts")
    async def alerts(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The calling team's budget alerts (its own budgets and its keys'), newest first."""
        return await _listed(request, settings, caller.team, alerts.listed)

    @get("/admin/usage/alerts")
    async def admin_alerts(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        return await _listed(request, settings, _admin_team(request, settings), alerts.listed)

    @get("/usage/events")
    async def team_events(
        self,
        request: Request,
        settings: NamedDependency[Settings],
        caller: NamedDependency[TeamPolicy],
    ) -> Response[bytes]:
        """The calling team's webhook events, newest first: delivered, pending or given up, with
        the tries so far and the last try's error (to debug its receiver)."""
        return await _listed(request, settings, caller.team, events.listed)

    @get("/admin/usage/events")
    async def admin_events(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        return await _listed(request, settings, _admin_team(request, settings), events.listed)

    @get("/admin/usage/users")
    async def admin_end_users(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        team = _admin_team(request, settings)
        return await _listed(request, settings, team, reports.by_end_user)

    @get("/admin/usage")
    async def admin_usage(
        self, request: Request, settings: NamedDependency[Settings]
    ) -> Response[bytes]:
        team = _admin_team(request, settings)
        return await _answer(request, settings, team, {"object": "usage", "team": team})
