"""The admin REST API under `/v1/admin/`, for scripts holding an admin key (TOKENYARD_ADMIN_KEY, or
one of TOKENYARD_ADMIN_KEYS, as `Authorization: Bearer`): teams (create, read, update limits,
disable and enable, delete), their daily budgets with today's spend, and keys (create — the
secret shown once —, list, read one with today's use of its own budget, change a key's name,
expiry, models or limits, revoke, rotate), and the trail of those changes (each by
"admin-api:<the admin key's holder>" here). The operations are tenancy/service.py's, as for the
CLI and the admin UI: whatever changes a team's limits or a key's standing drops the gateways'
cached lookups of the keys concerned, so it applies at once. Errors are OpenAI's shape."""

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Controller, Request, Response, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from msgspec import UNSET, UnsetType

from tokenyard.core.errors import GatewayError
from tokenyard.core.openapi import json_body
from tokenyard.core.operator_keys import require_admin
from tokenyard.core.settings import Settings
from tokenyard.gateway.proxy import Proxy
from tokenyard.gateway.quotas import Quotas
from tokenyard.gateway.validation import decode_json
from tokenyard.router.upstreams import check_models
from tokenyard.tenancy import events
from tokenyard.tenancy.changes import MAX_LISTED, change_record
from tokenyard.tenancy.end_users import block_record
from tokenyard.tenancy.errors import AlreadyExists, ManagementError
from tokenyard.tenancy.keys import NewKey
from tokenyard.tenancy.limits import KEY_LIMIT_FIELDS
from tokenyard.tenancy.models import Team
from tokenyard.tenancy.service import Tenancy
from tokenyard.tenancy.teams import team_record

_S = TypeVar("_S", bound=msgspec.Struct)
Count = Annotated[int, msgspec.Meta(ge=0)]
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]
Dollars = Annotated[float, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class TeamLimits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A team's limits: a field left out is kept, null makes it unlimited (the CLI's flags)."""

    rpm: Count | UnsetType | None = UNSET
    tpm: Count | UnsetType | None = UNSET
    tokens_per_day: Count | UnsetType | None = UNSET
    batch_tokens_per_day: Count | UnsetType | None = UNSET
    usd_per_day: Dollars | UnsetType | None = UNSET
    usd_per_month: Dollars | UnsetType | None = UNSET
    concurrency: Count | UnsetType | None = UNSET
    kv_pages: Count | UnsetType | None = UNSET
    max_tokens: Count | UnsetType | None = UNSET
    max_context: Count | UnsetType | None = UNSET
    models: list[str] | UnsetType = UNSET  # model ids the team may use; empty: all
    default_tier: str | UnsetType = UNSET
    auto_threshold: Share | UnsetType | None = UNSET
    strong_share: Share | UnsetType | None = UNSET
    auto_quality: Share | UnsetType | None = UNSET
    cache_ttl_s: Seconds | UnsetType | None = UNSET
    # each end user's own, within the team
    user_rpm: Count | UnsetType | None = UNSET
    user_tpm: Count | UnsetType | None = UNSET
    user_usd_per_day: Dollars | UnsetType | None = UNSET
    alert_url: str | UnsetType | None = UNSET  # the team's own receiver of its budget alerts
    webhook_url: str | UnsetType | None = UNSET  # ... and of its events (responses, batches)
    # single models' own: {"gpt-4o": {"rpm": 100, "tpm": 50000}}; replaces the team's; null: none
    model_limits: dict[str, dict[str, int]] | UnsetType | None = UNSET
    # the kinds of endpoint its keys may call (["embeddings"], or "completions,batch"); null: all
    scopes: list[str] | str | UnsetType | None = UNSET
    # the tags every deployment serving it must carry (["eu"]); null: any deployment
    deployment_tags: list[str] | str | UnsetType | None = UNSET


class NewTeam(TeamLimits, kw_only=True, forbid_unknown_fields=True):
    name: str


class Budget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A team's budgets (UTC days, calendar months): left out, kept; null, unlimited."""

    tokens_per_day: Count | UnsetType | None = UNSET
    batch_tokens_per_day: Count | UnsetType | None = UNSET
    usd_per_day: Dollars | UnsetType | None = UNSET
    usd_per_month: Dollars | UnsetType | None = UNSET


class KeyChanges(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A key's settings: a field left out is kept; null clears a name, an expiry or a limit of
    the key's own."""

    name: str | UnsetType | None = UNSET
    expires_at: int | UnsetType | None = UNSET  # unix seconds
    models: list[str] | UnsetType = UNSET  # empty: the team's
    rpm: Count | UnsetType | None = UNSET
    tpm: Count | UnsetType | None = UNSET
    usd_per_day: Dollars | UnsetType | None = UNSET
    usd_per_month: Dollars | UnsetType | None = UNSET
    concurrency: Count | UnsetType | None = UNSET
    model_limits: dict[str, dict[str, int]] | UnsetType | None = UNSET  # replaces the key's
    scopes: list[str] | str | UnsetType | None = UNSET  # within its team's; null: the team's


class Block(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An end user to block: the name the team's requests give it (`safety_identifier` or
    `user`), and a note of why."""

    user: str
    reason: str | None = None


class CreateKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    team: str
    name: str | None = None  # a label shown in listings
    expires_at: int | None = None  # unix seconds: refused from then on; None: until revoked
    models: list[str] = []  # the models it may use, within its team's; empty: the team's
    # its own limits, beside its team's (None: the team's alone)
    rpm: Count | None = None
    tpm: Count | None = None
    usd_per_day: Dollars | None = None
    usd_per_month: Dollars | None = None
    concurrency: Count | None = None
    model_limits: dict[str, dict[str, int]] | None = None  # {"gpt-4o": {"rpm": 10}}
    scopes: list[str] | str | None = None  # the kinds of endpoint it may call, within its team's


def _set(struct: msgspec.Struct, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields a body gave (left out: UNSET), but those in `skip`."""
    return {
        name: value
        for name in struct.__struct_fields__
        if name not in skip and (value := getattr(struct, name)) is not UNSET
    }


def _body(raw: bytes, struct: type[_S]) -> _S:
    try:
        return msgspec.convert(decode_json(raw), struct)
    except msgspec.ValidationError as exc:
        raise GatewayError(400, str(exc)) from None


def _json(data: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(data), status_code=status, media_type="application/json")


def _admin_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    # a guard runs before dependencies are resolved: it reads the settings from the app's state,
    # and leaves the key's holder for the `actor` dependency
    settings: Settings = connection.app.state.settings
    connection.state.admin = require_admin(connection.headers.get("authorization"), settings)


def _actor(request: Request) -> str:
    """Who the trail of changes names for this API's: the admin key's holder."""
    return f"admin-api:{request.state.admin}"


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """A tenancy operation's refusals as HTTP errors."""
    try:
        yield
    except AlreadyExists as exc:
        raise GatewayError(409, str(exc), code="already_exists") from None
    except ManagementError as exc:
        raise GatewayError(404, str(exc), code="not_found") from None
    except ValueError as exc:
        raise GatewayError(400, str(exc)) from None


def _count(raw: str, param: str) -> int:
    if not raw.isdigit():
        raise GatewayError(400, f"{param} must be a whole number", param=param)
    return int(raw)


def _expiry(unix: int | None) -> datetime | None:
    if unix is None:
        return None
    try:
        return datetime.fromtimestamp(unix, UTC)
    except (OverflowError, OSError, ValueError):
        raise GatewayError(400, "expires_at is not a time", param="expires_at") from None


def _created(new: NewKey) -> dict[str, Any]:
    """A new key as the API answers it: its secret, shown this once."""
    expires = int(new.expires_at.timestamp()) if new.expires_at else None
    return {
        "key": new.key,
        "prefix": new.prefix,
        "team": new.team,
        "name": new.name,
        "models": list(new.models),
        "limits": new.limits,
        "expires_at": expires,
    }


async def _existing(tenancy: Tenancy, name: str) -> Team:
    team = await tenancy.team(name)
    if team is None:
        raise GatewayError(404, f"no team {name!r}", code="not_found")
    return team


class ModelsToCheck(msgspec.Struct, forbid_unknown_fields=True):
    models: list[str] = msgspec.field(default_factory=list)  # empty: every configured model


class AdminController(Controller):
    path = "/v1/admin"
    guards = (_admin_only,)
    dependencies = {"actor": Provide(_actor, sync_to_thread=False)}  # noqa: RUF012 - Litestar's

    @post("/models/check", status_code=200, operation_class=json_body(ModelsToCheck))
    async def check_models(
        self, request: Request, proxy: NamedDependency[Proxy]
    ) -> Response[bytes]:
        """Each configured model's deployments or replicas sent the smallest real request, once
        (router/upstreams.py check_models): which answer, how fast, and why not."""
        asked = _body(await request.body() or b"{}", ModelsToCheck)
        try:
            checks = await check_models(proxy.router.catalog, proxy.backends, asked.models)
        except ValueError as exc:
            raise GatewayError(404, str(exc), code="model_not_found", param="models") from None
        return _json({"object": "list", "data": [asdict(c) for c in checks]})

    @get("/teams")
    async def list_teams(self, tenancy: NamedDependency[Tenancy]) -> Response[bytes]:
        teams = await tenancy.teams()
        return _json({"object": "list", "data": [team_record(t) for t in teams]})

    @post("/teams", operation_class=json_body(NewTeam))
    async def create_team(
        self, actor: NamedDependency[str], request: Request, tenancy: NamedDependency[Tenancy]
    ) -> Response[bytes]:
        new = _body(await request.body(), NewTeam)
        with _refusals():
            team = await tenancy.create_team(new.name, actor=actor, **_set(new, skip=("name",)))
        return _json(team_record(team), 201)

    @get("/teams/{name:str}")
    async def read_team(
        self, tenancy: NamedDependency[Tenancy], name: FromPath[str]
    ) -> Response[bytes]:
        return _json(team_record(await _existing(tenancy, name)))

    @patch("/teams/{name:str}", operation_class=json_body(TeamLimits))
    async def update_team(
        self,
        actor: NamedDependency[str],
        request: Request,
        tenancy: NamedDependency[Tenancy],
        name: FromPath[str],
    ) -> Response[bytes]:
        limits = _set(_body(await request.body(), TeamLimits))
        with _refusals():
            team = await tenancy.update_team(name, actor=actor, **limits)
        return _json(team_record(team))

    @post("/teams/{name:str}/disable")
    async def disable_team(
        self, actor: NamedDependency[str], tenancy: NamedDependency[Tenancy], name: FromPath[str]
    ) -> Response[bytes]:
        with _refusals():
            team = await tenancy.set_disabled(name, True, actor=actor)
        return _json(team_record(team))

    @post("/events/{event_id:str}/send")
    async def send_event_again(
        self, tenancy: NamedDependency[Tenancy], event_id: FromPath[str]
    ) -> Response[bytes]:
        """A team's webhook event not delivered, due again at once with its tries counted afresh
        (tenancy/events.py); 404 where there is none such to send."""
        if not await asyncio.to_thread(events.send_again, tenancy.sql, event_id):
            raise GatewayError(
                404, f"no event {event_id!r} waiting to be sent", code="not_found", param="event_id"
            )
        return _json({"id": event_id, "object": "event", "state": "pending"})

    @post("/teams/{name:str}/enable")
    async def enable_team(
        self, actor: NamedDependency[str], tenancy: NamedDependency[Tenancy], name: FromPath[str]
    ) -> Response[bytes]:
        with _refusals():
            team = await tenancy.set_disabled(name, False, actor=actor)
        return _json(team_record(team))

    @delete("/teams/{name:str}", status_code=200)
    async def delete_team(
        self, actor: NamedDependency[str], tenancy: NamedDependency[Tenancy], name: FromPath[str]
    ) -> Response[bytes]:
        with _refusals():
            await tenancy.delete_team(name, actor=actor)
        return _json({"name": name, "deleted": True})

    @get("/teams/{name:str}/budget")
    async def read_budget(
        self,
        tenancy: NamedDependency[Tenancy],
        quotas: NamedDependency[Quotas],
        name: FromPath[str],
    ) -> Response[bytes]:
        return _json(await _budget(quotas, await _existing(tenancy, name)))

    @put("/teams/{name:str}/budget", operation_class=json_body(Budget))
    async def set_budget(
        self,
        actor: NamedDependency[str],
        request: Request,
        tenancy: NamedDependency[Tenancy],
        quotas: NamedDependency[Quotas],
        name: FromPath[str],
    ) -> Response[bytes]:
        limits = _set(_body(await request.body(), Budget))
        with _refusals():
            team = await tenancy.update_team(name, actor=actor, **limits)
        return _json(await _budget(quotas, team))

    @get("/teams/{name:str}/blocked-users")
    async def list_blocked(
        self, tenancy: NamedDependency[Tenancy], name: FromPath[str]
    ) -> Response[bytes]:
        await _existing(tenancy, name)
        found = await tenancy.blocked(name)
        return _json({"object": "list", "team": name, "data": [block_record(b) for b in found]})

    @post("/teams/{name:str}/blocked-users", operation_class=json_body(Block))
    async def block_user(
        self,
        actor: NamedDependency[str],
        request: Request,
        tenancy: NamedDependency[Tenancy],
        name: FromPath[str],
    ) -> Response[bytes]:
        """Refuse the team's requests naming this end user (403 end_user_blocked), from the
        next request on, on every gateway within the key-cache time."""
        block = _body(await request.body(), Block)
        with _refusals():
            await tenancy.block_end_user(name, block.user, block.reason, actor=actor)
        return _json({"team": name, "user": block.user, "blocked": True}, 201)

    @delete("/teams/{name:str}/blocked-users", status_code=200)
    async def unblock_user(
        self,
        actor: NamedDependency[str],
        request: Request,
        tenancy: NamedDependency[Tenancy],
        name: FromPath[str],
    ) -> Response[bytes]:
        """`?user=`: a query parameter, so that any name (slashes included) can be given."""
        user = request.query_params.get("user")
        if not user:
            raise GatewayError(400, "name the end user: ?user=", param="user")
        with _refusals():
            await tenancy.unblock_end_user(name, user, actor=actor)
        return _json({"team": name, "user": user, "blocked": False})

    @get("/changes")
    async def list_changes(
        self, request: Request, tenancy: NamedDependency[Tenancy]
    ) -> Response[bytes]:
        """The newest changes to teams and keys first (`team=` one team's; `limit=` 1-1000,
        default 100; `before=<id>` the page after the one ending there)."""
        params = request.query_params
        limit, before = _count(params.get("limit", "100"), "limit"), params.get("before")
        if not 1 <= limit <= MAX_LISTED:
            raise GatewayError(400, f"limit must be 1 to {MAX_LISTED}", param="limit")
        found = await tenancy.changes(
            params.get("team") or None,
            limit + 1,  # one more than asked: whether the list goes on
            None if before is None else _count(before, "before"),
        )
        data = [change_record(c) for c in found[:limit]]
        return _json({"object": "list", "data": data, "has_more": len(found) > limit})

    @get("/keys")
    async def list_keys(
        self, request: Request, tenancy: NamedDependency[Tenancy]
    ) -> Response[bytes]:
        found = await tenancy.keys(request.query_params.get("team") or None)
        return _json({"object": "list", "data": [k.record() for k in found]})

    @post("/keys", operation_class=json_body(CreateKey))
    async def create_key(
        self, actor: NamedDependency[str], request: Request, tenancy: NamedDependency[Tenancy]
    ) -> Response[bytes]:
        new_key = _body(await request.body(), CreateKey)
        expires = _expiry(new_key.expires_at)
        with _refusals():
            limits = {name: getattr(new_key, name) for name in KEY_LIMIT_FIELDS}
            new = await tenancy.create_key(
                new_key.team, new_key.name, expires, new_key.models, limits, actor=actor
            )
        return _json(_created(new), 201)

    @get("/keys/{prefix:str}")
    async def read_key(
        self,
        tenancy: NamedDependency[Tenancy],
        quotas: NamedDependency[Quotas],
        prefix: FromPath[str],
    ) -> Response[bytes]:
        """One key as listings show it, with what today (UTC) and this month have used of its own
        dollar budgets (null: the key has none, and its spend is not counted apart;
        /v1/admin/usage has it; a budget it lacks reads 0)."""
        info = await tenancy.key(prefix)
        if info is None:
            raise GatewayError(404, f"no key with prefix {prefix!r}", code="not_found")
        today = None
        if info.limits.get("usd_per_day") or info.limits.get("usd_per_month"):
            day, month = await quotas.key_spent(info.team, prefix)
            today = {"usd": day, "usd_month": month}
        return _json(info.record() | {"today": today})

    @patch("/keys/{prefix:str}", operation_class=json_body(KeyChanges))
    async def update_key(
        self,
        actor: NamedDependency[str],
        request: Request,
        tenancy: NamedDependency[Tenancy],
        prefix: FromPath[str],
    ) -> Response[bytes]:
        changes = _set(_body(await request.body(), KeyChanges))
        if "expires_at" in changes:
            changes["expires_at"] = _expiry(changes["expires_at"])
        with _refusals():
            info = await tenancy.update_key(prefix, actor=actor, **changes)
        return _json(info.record())

    @post("/keys/{prefix:str}/revoke")
    async def revoke_key(
        self, actor: NamedDependency[str], tenancy: NamedDependency[Tenancy], prefix: FromPath[str]
    ) -> Response[bytes]:
        with _refusals():
            await tenancy.revoke_key(prefix, actor=actor)
        return _json({"prefix": prefix, "revoked": True})

    @post("/keys/{prefix:str}/rotate")
    async def rotate_key(
        self, actor: NamedDependency[str], tenancy: NamedDependency[Tenancy], prefix: FromPath[str]
    ) -> Response[bytes]:
        with _refusals():
            new = await tenancy.rotate_key(prefix, actor=actor)
        return _json({**_created(new), "revoked": prefix}, 201)


async def _budget(quotas: Quotas, team: Team) -> dict[str, Any]:
    """The daily budgets and what today (UTC) has used of them, from the quota counters."""
    return {
        "team": team.name,
        "tokens_per_day": team.tokens_per_day,
        "batch_tokens_per_day": team.batch_tokens_per_day,
        "usd_per_day": team.usd_per_day,
        "usd_per_month": team.usd_per_month,
        "today": asdict(await quotas.used_today(team.name)),
    }
