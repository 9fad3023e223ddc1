"""Live status: each model's replicas, load and circuit, its deployments and their own limits,
and the refusals of the last hour; and a check of every deployment and replica on request."""

from datetime import UTC, datetime

from litestar import Controller, Request, Response, get, post

from tokenyard.admin_ui import render, status
from tokenyard.admin_ui.access import admin_only, proxy_of
from tokenyard.router.upstreams import check_models


class Status(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/status")
    async def live_status(self, request: Request) -> Response:
        models, refused = await status.collect(proxy_of(request))
        return await render.page(
            request, "status.html", models=models, refused=refused, now=datetime.now(UTC)
        )

    @post("/status/check", status_code=200)
    async def check(self, request: Request) -> Response:
        """Every configured model's deployments or replicas tried once (router/upstreams.py)."""
        proxy = proxy_of(request)
        checks = await check_models(proxy.router.catalog, proxy.backends)
        return await render.page(request, "checks.html", checks=checks, now=datetime.now(UTC))
