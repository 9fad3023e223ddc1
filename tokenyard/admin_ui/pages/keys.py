"""API keys: every team's, with their names, expiries, last use and charges; create (the secret
shown once, optionally named, narrowed and limited), change a key's name, models, limits and
expiry in place, rotate and revoke."""

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from tokenyard.admin_ui import forms, render
from tokenyard.admin_ui.access import (
    actor_of,
    admin_only,
    in_thread,
    proxy_of,
    settings_of,
    sql_of,
    tenancy_of,
)
from tokenyard.billing import reports
from tokenyard.gateway import auth
from tokenyard.tenancy.errors import ManagementError
from tokenyard.tenancy.keys import KeyInfo
from tokenyard.tenancy.limits import KEY_LIMIT_FIELDS, model_limits_text
from tokenyard.tenancy.policy import model_list

SPEND_DAYS = 30
EXPIRY_FORMAT = "%Y-%m-%dT%H:%M"  # an <input type="datetime-local">'s value, read as UTC


async def key_columns(
    request: Request, listed: list[KeyInfo], team: str | None = None
) -> dict[str, Any]:
    """What the keys table shows beside the keys themselves (all of one team's, or every team's):
    each one's last use (the gateways' Redis record, else the SQL column) and its charges over the
    last SPEND_DAYS UTC days."""
    if not listed:
        return {"last_used": {}, "spend": {}, "spend_days": SPEND_DAYS}
    stamps = await proxy_of(request).quotas.redis.hmget(auth.LAST_USED, [k.prefix for k in listed])
    today = datetime.now(UTC).date()
    start = today - timedelta(days=SPEND_DAYS - 1)
    totals = await in_thread(reports.by_key, sql_of(request), start, today, team)
    return {
        "last_used": {
            k.prefix: datetime.fromtimestamp(int(s), UTC) if s else k.last_used_at
            for k, s in zip(listed, stamps, strict=True)
        },
        "spend": {prefix: t["cost_usd"] for prefix, t in totals.items()},
        "spend_days": SPEND_DAYS,
    }


def _shown(expires_at: datetime | None) -> str:
    """An expiry as the key's form shows it (to the minute, UTC; "": never)."""
    return expires_at.strftime(EXPIRY_FORMAT) if expires_at else ""


def _outside_catalog(request: Request, models: list[str]) -> str:
    """The refusal for models the catalog does not have ("" when all are in it)."""
    unknown = sorted(set(models) - set(proxy_of(request).router.catalog.models))
    return f"not in the catalog: {', '.join(unknown)}" if unknown else ""


def _key_form(request: Request, form: Any) -> tuple[list[str], dict[str, Any], str]:
    """A key form's models and own limits, and what is wrong with them ("": nothing), models
    the catalog lacks included."""
    models = forms.picked_models(form)
    limits, wrong = forms.key_limits(form)
    if unknown := _outside_catalog(request, models):
        return models, limits, unknown
    if unknown := _outside_catalog(request, list(limits.get("model_limits") or {})):
        return models, limits, f"{forms.LABELS['model_limits'][0]}: {unknown}"
    return models, limits, wrong


class Keys(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    async def _page(self, request: Request, status: int = 200, error: str = "") -> Response:
        listed = await tenancy_of(request).keys()
        teams = await tenancy_of(request).teams()
        return await render.page(
            request,
            "keys.html",
            status,
            keys=listed,
            teams=[t.name for t in teams],
            catalog=list(proxy_of(request).router.catalog.models),
            **await key_columns(request, listed),
            revoked=request.query_params.get("revoked", ""),
            saved=request.query_params.get("saved", ""),
            error=error,
        )

    @get("/keys")
    async def keys_page(self, request: Request) -> Response:
        return await self._page(request)

    @post("/keys")
    async def create_key(self, request: Request) -> Response:
        form = await request.form()
        days = forms.text(form, "expires_in_days").strip()
        try:
            expires = datetime.now(UTC) + timedelta(days=float(days)) if days else None
        except (ValueError, OverflowError):
            return await self._page(request, 400, "Expires in: a number of days, or blank")
        models, limits, wrong = _key_form(request, form)
        if wrong:
            return await self._page(request, 400, wrong)
        try:
            new = await tenancy_of(request).create_key(
                forms.text(form, "team"),
                forms.text(form, "name"),
                expires,
                models,
                limits,
                actor=actor_of(request),
            )
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        except ValueError as exc:  # the name, an expiry not in the future, a model not the team's
            return await self._page(request, 400, str(exc))
        return await render.page(request, "key_created.html", 201, new=new, replaced="")

    async def _key_page(
        self,
        request: Request,
        key: KeyInfo,
        values: dict[str, Any],
        status: int = 200,
        error: str = "",
    ) -> Response:
        team = await tenancy_of(request).team(key.team)
        allowed = model_list(team.models) if team else ()
        budgets = (key.limits.get("usd_per_day"), key.limits.get("usd_per_month"))
        quotas = proxy_of(request).quotas
        spent = await quotas.key_spent(key.team, key.prefix) if any(budgets) else None
        return await render.page(
            request,
            "key.html",
            status,
            key=key,
            budgets=budgets,
            spent=spent,
            values=values,
            models=allowed or list(proxy_of(request).router.catalog.models),
            cache_s=settings_of(request).gateway_key_cache_s,
            error=error,
        )

    async def _active(self, request: Request, prefix: str) -> KeyInfo:
        key = await tenancy_of(request).key(prefix)
        if key is None or key.revoked:
            raise NotFoundException(f"no active key with prefix {prefix!r}")
        return key

    @get("/keys/{prefix:str}")
    async def key_page(self, request: Request, prefix: FromPath[str]) -> Response:
        key = await self._active(request, prefix)
        expires = _shown(key.expires_at)
        values = {"name": key.name or "", "models": key.models, "expires_at": expires}
        values |= {n: "" if v is None else v for n, v in key.limits.items()}
        values["model_limits"] = model_limits_text(key.limits["model_limits"])
        return await self._key_page(request, key, values)

    @post("/keys/{prefix:str}")
    async def update_key(self, request: Request, prefix: FromPath[str]) -> Response:
        """The form's name, models, own limits and expiry; an expiry shown and sent back unchanged
        is kept to the second (the form shows minutes), so renaming an expired key is not
        refused."""
        key = await self._active(request, prefix)
        form = await request.form()
        expires = forms.text(form, "expires_at").strip()
        models, limits, wrong = _key_form(request, form)
        values = {"name": forms.text(form, "name"), "models": models, "expires_at": expires}
        values |= {n: forms.text(form, n) for n in KEY_LIMIT_FIELDS}
        if wrong:
            return await self._key_page(request, key, values, 400, wrong)
        changes: dict[str, Any] = {"name": values["name"].strip() or None, "models": models}
        changes |= limits
        if expires != _shown(key.expires_at):
            try:
                changes["expires_at"] = (
                    datetime.fromisoformat(expires).replace(tzinfo=UTC) if expires else None
                )
            except ValueError:
                error = "Expires: a date and time (UTC), or blank"
                return await self._key_page(request, key, values, 400, error)
        try:
            await tenancy_of(request).update_key(prefix, actor=actor_of(request), **changes)
        except ManagementError as exc:  # revoked meanwhile
            raise NotFoundException(str(exc)) from None
        except ValueError as exc:  # the name, an expiry not in the future, a model not the team's
            return await self._key_page(request, key, values, 400, str(exc))
        return Redirect(f"/admin/keys?saved={quote(prefix)}", status_code=303)

    @post("/keys/{prefix:str}/revoke")
    async def revoke_key(self, request: Request, prefix: FromPath[str]) -> Response:
        try:
            await tenancy_of(request).revoke_key(prefix, actor=actor_of(request))
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return Redirect(f"/admin/keys?revoked={quote(prefix)}", status_code=303)

    @post("/keys/{prefix:str}/rotate")
    async def rotate_key(self, request: Request, prefix: FromPath[str]) -> Response:
        """A new key for the team, with the old one's name, expiry, models and limits; the old one
        revoked."""
        try:
            new = await tenancy_of(request).rotate_key(prefix, actor=actor_of(request))
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return await render.page(request, "key_created.html", 201, new=new, replaced=prefix)
