"""One structured line per HTTP request (logger `tokenyard.access`, JSON): request id, method,
path, status, latency, and for completions the team, the model asked and served and the tokens.
Never a prompt, a query string or a key. An ASGI wrapper around the whole app, so refusals made
before any route (404, 405, 413) are logged as well."""

import logging
import time
from typing import Any

import msgspec

from tokenyard.core.usage import UsageEvent
from tokenyard.gateway import request_ids

log = logging.getLogger("tokenyard.access")
_USAGE_KEY = "tokenyard_usage"  # the request's usage event, which the proxy fills in as it goes
_FROM_USAGE = ("team", "model", "model_served", "tier")
_COUNTS = ("prompt_tokens", "completion_tokens")  # known once the request settled


def attach_usage(scope: Any, event: UsageEvent) -> None:
    """Hand the access log the usage event of this request (the proxy's, updated at settle)."""
    scope.setdefault("state", {})[_USAGE_KEY] = event


class AccessLog:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if log.isEnabledFor(logging.INFO):
                log.info(_line(scope, status, time.perf_counter() - started))


def _line(scope: Any, status: int, elapsed: float) -> str:
    entry: dict[str, Any] = {
        "request_id": request_ids.request_id(scope),
        "method": scope["method"],
        "path": scope["path"],
        "status": status or 499,  # none sent: the client was gone first
        "latency_ms": round(elapsed * 1000, 1),
    }
    usage = scope.get("state", {}).get(_USAGE_KEY)
    if usage is not None:
        entry.update({name: getattr(usage, name) for name in _FROM_USAGE})
        # a stream settles after its last byte, maybe after this line: its counts are not known
        settled = usage.status != 0
        entry.update({name: getattr(usage, name) if settled else None for name in _COUNTS})
    return msgspec.json.encode(entry).decode()
