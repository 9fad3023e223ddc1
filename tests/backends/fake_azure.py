"""A fake Azure OpenAI resource: OpenAI's API (fake_openai.py answers) at Azure's addresses, with
Azure's differences on the wire, as the `openai` SDK's AzureOpenAI client and Azure's v1 API
expect them:
- a deployment's routes, POST /openai/deployments/{name}/chat/completions (and /completions),
  need `?api-version=`; Azure answers 404 "Resource not found" without it. The v1 API,
  POST /openai/v1/chat/completions, takes none, and the deployment's name as `model`;
- the key comes in an `api-key` header (the v1 API also takes `Authorization: Bearer`), or a
  Microsoft Entra ID token in `Authorization: Bearer` on any route (those fake_tokens.py issues,
  `entra.…`); without either, 401 in Azure's error shape;
- replies carry Azure's content-filter annotations (`prompt_filter_results`, each choice's
  `content_filter_results`), and a stream opens with a chunk of no choices that holds the prompt's
  (model "", as Azure sends it);
- the model named in a reply is the deployment's model, a dated snapshot.

GET /stats adds `deployment` and `api_version` (the last request's) to fake_openai's figures.

Run: python tests/backends/fake_azure.py --port P
"""

import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import msgspec

if not __package__:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.backends import fake_openai
from tests.backends.fake_common import main, send_json, stats_with

SNAPSHOT = "gpt-4o-2024-08-06"
_DEPLOYMENT = re.compile(r"^/openai/deployments/([^/]+)(/(?:chat/)?completions)$")
_V1 = re.compile(r"^/openai/v1(/(?:chat/)?completions)$")
SAFE = {"filtered": False, "severity": "safe"}
FILTERS = {k: SAFE for k in ("hate", "self_harm", "sexual", "violence")}
PROMPT_FILTERS = [{"prompt_index": 0, "content_filter_results": FILTERS}]


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": str(status), "message": message}}


def _annotated(payload: bytes) -> bytes:
    """A reply or chunk as Azure words it: the deployment's model, content-filter results."""
    data = msgspec.json.decode(payload)
    if not isinstance(data, dict) or "choices" not in data:
        return payload
    data["model"] = SNAPSHOT
    for choice in data["choices"]:
        choice["content_filter_results"] = FILTERS
    if data.get("object") in ("chat.completion", "text_completion") and "usage" in data:
        data["prompt_filter_results"] = PROMPT_FILTERS
    return msgspec.json.encode(data)


def make_app() -> Any:
    inner = fake_openai.make_app()
    seen: dict[str, str] = {"deployment": "", "api_version": ""}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in ("/health", "/stats", "/control"):
            if scope.get("path") == "/stats":
                return await stats_with(inner, scope, receive, send, seen)
            return await inner(scope, receive, send)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        query = parse_qs(scope.get("query_string", b"").decode())
        path = scope["path"]
        deployment, v1 = _DEPLOYMENT.match(path), _V1.match(path)
        if deployment is None and v1 is None:
            return await send_json(send, 404, _error(404, "Resource not found"))
        if deployment is not None and "api-version" not in query:
            return await send_json(send, 404, _error(404, "Resource not found"))
        bearer = headers.get("authorization", "").removeprefix("Bearer ")
        key = headers.get("api-key") or (bearer if v1 or bearer.startswith("entra.") else "")
        if not key:
            message = "Access denied due to invalid subscription key or wrong API endpoint."
            return await send_json(send, 401, _error(401, message))
        seen["deployment"] = deployment.group(1) if deployment else ""
        seen["api_version"] = query.get("api-version", [""])[0]
        route = deployment.group(2) if deployment else v1.group(1) if v1 else ""
        inner_headers = [(k, v) for k, v in scope["headers"] if k not in (b"api-key",)]
        inner_headers.append((b"authorization", b"Bearer " + key.encode()))
        inner_scope = {**scope, "path": "/v1" + route, "headers": inner_headers}
        streaming = False

        async def azure_send(message: dict[str, Any]) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                kinds = dict(message.get("headers", []))
                streaming = kinds.get(b"content-type", b"").startswith(b"text/event-stream")
                await send(message)
                if streaming and message["status"] == 200:  # the prompt's filters come first
                    opening = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
                    opening["prompt_filter_results"] = PROMPT_FILTERS
                    data = b"data: " + msgspec.json.encode(opening) + b"\n\n"
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                return
            body = message.get("body", b"")
            if body and streaming:
                events = body.split(b"\n\n")
                body = b"\n\n".join(
                    b"data: " + _annotated(e[6:]) if e.startswith(b"data: {") else e for e in events
                )
            elif body:
                body = _annotated(body)
            await send({**message, "body": body})

        await inner(inner_scope, receive, azure_send)

    return app


if __name__ == "__main__":
    main(make_app, "a fake Azure OpenAI resource for tests")
