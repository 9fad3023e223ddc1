"""The gateway's own id for each HTTP request, sent back on every response (errors included), so a
user can always quote it and the SDKs' `error.request_id` is never empty."""

import os
from typing import Any

from litestar.datastructures import MutableScopeHeaders

_STATE_KEY = "tokenyard_request_id"


def new_request_id() -> str:
    return "req-" + os.urandom(12).hex()


def request_id(scope: Any) -> str:
    """This request's id, made on first use: by the proxy (it goes upstream and into billing), else
    when the response starts."""
    state = scope.setdefault("state", {})
    if _STATE_KEY not in state:
        state[_STATE_KEY] = new_request_id()
    return state[_STATE_KEY]


async def add_request_id(message: Any, scope: Any) -> None:
    """Litestar's before_send hook: every HTTP response carries x-request-id."""
    if message["type"] == "http.response.start":
        headers = MutableScopeHeaders.from_message(message)
        if "x-request-id" not in headers:
            headers["x-request-id"] = request_id(scope)
