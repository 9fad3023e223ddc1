"""A fake Vertex AI serving Anthropic's models: Anthropic's Messages API (fake_anthropic.py answers)
under Google Cloud's addresses, with Vertex's differences on the wire, as the `anthropic` SDK's
AnthropicVertex client expects them:
- POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict
  (a whole reply) or :streamRawPredict (a stream), and .../models/count-tokens:rawPredict;
- the model is named by the path, never in the body (a body naming one is refused), and the body
  names `anthropic_version` "vertex-2023-10-16" (refused without);
- a Google Cloud access token in `Authorization: Bearer` (no API key); without one, 401 in Google's
  error shape (`{"error": {"code", "message", "status"}}`), as are unknown routes (404).

GET /stats adds `project`, `region`, `model`, `verb` and `token` (the last request's) to
fake_anthropic's figures.

Run: python tests/backends/fake_vertex.py --port P
"""

import re
import sys
from pathlib import Path
from typing import Any

import msgspec

if not __package__:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.backends import fake_anthropic
from tests.backends.fake_common import main, read_body, replayed, send_json, stats_with

VERSION = "vertex-2023-10-16"
_ROUTE = re.compile(
    r"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/anthropic/models/([^/:]+)"
    r":(rawPredict|streamRawPredict)$"
)


def _google_error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": kind}}


def make_app() -> Any:
    inner = fake_anthropic.make_app()
    seen: dict[str, str] = {"project": "", "region": "", "model": "", "verb": "", "token": ""}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in ("/health", "/control"):
            return await inner(scope, receive, send)
        if scope["path"] == "/stats":
            return await stats_with(inner, scope, receive, send, seen)
        route = _ROUTE.match(scope["path"])
        if route is None:
            return await send_json(send, 404, _google_error(404, "Not found", "NOT_FOUND"))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        token = headers.get("authorization", "").removeprefix("Bearer ")
        if not token:
            message = "Request is missing required authentication credential."
            return await send_json(send, 401, _google_error(401, message, "UNAUTHENTICATED"))
        project, region, model, verb = route.groups()
        body = msgspec.json.decode(await read_body(receive))
        counting = model == "count-tokens"
        if body.pop("anthropic_version", None) != VERSION:
            return await send_json(send, 400, fake_anthropic.error(400, "anthropic_version"))
        if not counting and "model" in body:
            message = "model: Extra inputs are not permitted"
            return await send_json(send, 400, fake_anthropic.error(400, message))
        seen.update(project=project, region=region, model=model, verb=verb, token=token)
        inner_body = body if counting else {**body, "model": model}
        path = "/v1/messages/count_tokens" if counting else "/v1/messages"
        inner_headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
        inner_headers += [(b"x-api-key", token.encode()), (b"anthropic-version", b"2023-06-01")]
        replay = replayed(msgspec.json.encode(inner_body))
        await inner({**scope, "path": path, "headers": inner_headers}, replay, send)

    return app


if __name__ == "__main__":
    main(make_app, "a fake Vertex AI serving Anthropic's models, for tests")
