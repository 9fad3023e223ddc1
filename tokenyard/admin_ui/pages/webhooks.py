"""Teams' webhook events (tenancy/events.py): each event recorded for a team's `webhook_url`,
newest first, by team and range of days, with whether its receiver took it, how many tries it
took, and the last try's error; an event not delivered can be sent again (after its receiver was
fixed, say)."""

from urllib.parse import urlencode

from litestar import Controller, Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect

from tokenyard.admin_ui.access import admin_only, in_thread, sql_of
from tokenyard.admin_ui.listing import listed_page
from tokenyard.tenancy import events


class Webhooks(Controller):
    guards = [admin_only]  # noqa: RUF012 - Litestar reads it as a class attribute

    @get("/webhooks")
    async def webhooks(self, request: Request) -> Response:
        again = request.query_params.get("again")
        return await listed_page(request, "webhooks.html", events.listed, again=again)

    @post("/webhooks/{event_id:str}/send")
    async def send_again(self, request: Request, event_id: FromPath[str]) -> Response:
        if not await in_thread(events.send_again, sql_of(request), event_id):
            raise NotFoundException(f"no event {event_id!r} waiting to be sent")
        back = {k: v for k, v in request.query_params.items() if k in ("team", "start", "end")}
        return Redirect(f"/admin/webhooks?{urlencode(back | {'again': event_id})}", status_code=303)
