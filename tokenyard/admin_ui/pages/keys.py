"""API keys: every team's, with their names, expiries and last use; create (the secret shown once,
optionally named and expiring), rotate and revoke."""

from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from tokenyard.admin_ui import forms, render
from tokenyard.admin_ui.access import admin_only, proxy_of, tenancy_of
from tokenyard.gateway import auth
from tokenyard.tenancy.errors import ManagementError
from tokenyard.tenancy.keys import KeyInfo


async def last_used(request: Request, listed: list[KeyInfo]) -> dict[str, datetime | None]:
    """Each key's last use: the gateways' Redis record, else the SQL column."""
    if not listed:
        return {}
    stamps = await proxy_of(request).quotas.redis.hmget(auth.LAST_USED, [k.prefix for k in listed])
    return {
        k.prefix: datetime.fromtimestamp(int(s), UTC) if s else k.last_used_at
        for k, s in zip(listed, stamps, strict=True)
    }


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
            last_used=await last_used(request, listed),
            revoked=request.query_params.get("revoked", ""),
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
        models = [m for m in form.getall("models", []) if isinstance(m, str) and m]
        if unknown := sorted(set(models) - set(proxy_of(request).router.catalog.models)):
            return await self._page(request, 400, f"not in the catalog: {', '.join(unknown)}")
        try:
            new = await tenancy_of(request).create_key(
                forms.text(form, "team"), forms.text(form, "name"), expires, models
            )
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        except ValueError as exc:  # the name, an expiry not in the future, a model not the team's
            return await self._page(request, 400, str(exc))
        return await render.page(request, "key_created.html", 201, new=new, replaced="")

    @post("/keys/{prefix:str}/revoke")
    async def revoke_key(self, request: Request, prefix: FromPath[str]) -> Response:
        try:
            await tenancy_of(request).revoke_key(prefix)
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return Redirect(f"/admin/keys?revoked={quote(prefix)}", status_code=303)

    @post("/keys/{prefix:str}/rotate")
    async def rotate_key(self, request: Request, prefix: FromPath[str]) -> Response:
        """A new key for the team, with the old one's name and expiry; the old one revoked."""
        try:
            new = await tenancy_of(request).rotate_key(prefix)
        except ManagementError as exc:
            raise NotFoundException(str(exc)) from None
        return await render.page(request, "key_created.html", 201, new=new, replaced=prefix)
