"""Live status: each model's replicas, load and circuit, and the refusals of the last hour."""

from datetime import UTC, datetime

from litestar import Controller, Request, Response, get

from tokenyard.admin_ui import render, status
from tokenyard.admin_ui.access import admin_only, proxy_of


class Status(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/status")
    async def live_status(self, request: Request) -> Response:
        models, refused = await status.collect(proxy_of(request))
        return await render.page(
            request, "status.html", models=models, refused=refused, now=datetime.now(UTC)
        )
