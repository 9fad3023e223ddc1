"""A fake Amazon Bedrock serving Anthropic's models: Anthropic's Messages API (fake_anthropic.py
answers) under Bedrock's addresses and framing, as botocore's `bedrock-runtime` client (boto3's)
and Anthropic's AnthropicBedrock client expect them; and Bedrock's Converse API for any model
(fake_converse.py answers):
- POST /model/{modelId}/invoke (a whole reply, JSON), /model/{modelId}/invoke-with-response-stream
  (AWS event-stream frames, each `chunk` event's payload `{"bytes": base64 of one Anthropic
  event}`), /model/{modelId}/count-tokens (`{"input": {"invokeModel": {"body": base64 of the
  invoke body}}}` → `{"inputTokens": n}`);
- POST /model/{modelId}/converse and /model/{modelId}/converse-stream, the Converse API (its
  bodies, checks, replies and directives: fake_converse.py);
- every request signed with AWS Signature V4 for the service `bedrock`, checked against the key
  pair the fake is started with (`--access-key`, `--secret-key`), or carrying a Bedrock API key
  (`--api-key`) as `Authorization: Bearer`; else 403, as Bedrock refuses;
- an invoke body names `anthropic_version` "bedrock-2023-05-31", and neither `model` nor `stream`
  (the path says both); else 400 ValidationException;
- refusals as Bedrock words them: `{"message"}` with `x-amzn-ErrorType` (429 ThrottlingException,
  400 ValidationException, 403 AccessDeniedException, 404 ResourceNotFoundException, 503
  ServiceUnavailableException, 500 InternalServerException); an error inside a stream is an
  exception frame.

Both APIs share one fake_common state: /control's faults, request counts and #times apply to either.
GET /stats adds `model`, `verb`, `auth` ("sigv4" or "bearer") and `region` (the signature's) of
the last request to fake_common's figures (`last_body`: a Converse body as sent).

Run: python tests/backends/fake_bedrock.py --port P --access-key AK --secret-key SK [--api-key K]
"""

import argparse
import base64
import hmac
import re
import sys
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

if not __package__:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.backends import fake_anthropic, fake_converse
from tests.backends.fake_common import (
    Directives,
    Send,
    make_asgi,
    read_body,
    replayed,
    send_json,
    stats_with,
)
from tests.backends.fake_converse import frame, refusal

VERSION = "bedrock-2023-05-31"
CONVERSE = ("converse", "converse-stream")
_ROUTE = re.compile(
    r"^/model/([^/]+)/(invoke|invoke-with-response-stream|count-tokens|converse|converse-stream)$"
)
_SIGNED = re.compile(
    r"Credential=([^/]+)/\d+/([^/]+)/bedrock/aws4_request, "
    r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)"
)
STREAM_EXCEPTIONS = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
}


# whether the request in hand is a Converse one: the shared fake_common app reads its prompt and
# words its refusals by it (a context variable: one per request's task)
_CONVERSING: ContextVar[bool] = ContextVar("conversing", default=False)


def event_frame(event: bytes) -> bytes:
    payload = msgspec.json.encode({"bytes": base64.b64encode(event).decode()})
    kinds = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    return frame(kinds, payload)


def _prompt(body: Any) -> str:
    conversing = _CONVERSING.get()
    return (fake_converse.prompt_text if conversing else fake_anthropic.prompt_text)(body)


def _error(status: int, message: str) -> dict[str, Any]:
    return (fake_converse.error if _CONVERSING.get() else fake_anthropic.error)(status, message)


async def _handle(path: str, body: Any, headers: dict[str, str], d: Directives, send: Send) -> None:
    answer = fake_converse.handle if _CONVERSING.get() else fake_anthropic.handle
    await answer(path, body, headers, d, send)


def _named(send: Send) -> Send:
    """`send` giving each refusal the exception's name, as the shared app's own (#status, /control
    faults, a body that is not JSON) lack it."""

    async def named(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            headers = [h for h in message["headers"] if h[0] != b"x-amzn-errortype"]
            name = fake_converse.exception_name(message["status"]).encode()
            message = {**message, "headers": [*headers, (b"x-amzn-errortype", name)]}
        await send(message)

    return named


def make_app(access_key: str, secret_key: str, api_key: str = "") -> Any:
    # one fake_common app for both APIs, so faults, counts and /stats are shared
    inner = make_asgi(_handle, _error, _prompt)
    seen: dict[str, str] = {"model": "", "verb": "", "auth": "", "region": ""}

    def verify(scope: dict[str, Any], headers: dict[str, str], body: bytes) -> str | None:
        """How the request proved its sender ("sigv4", "bearer"), or None."""
        authorization = headers.get("authorization", "")
        if api_key and authorization == f"Bearer {api_key}":
            return "bearer"
        signed = _SIGNED.search(authorization)
        if signed is None or signed.group(1) != access_key:
            return None
        region, names, signature = signed.group(2), signed.group(3), signed.group(4)
        url = f"http://{headers['host']}{scope['raw_path'].decode()}"
        request = AWSRequest(
            "POST", url, data=body, headers={n: headers[n] for n in names.split(";")}
        )
        request.context["timestamp"] = headers["x-amz-date"]
        token = headers.get("x-amz-security-token")
        signer = SigV4Auth(Credentials(access_key, secret_key, token), "bedrock", region)
        expected = signer.signature(
            signer.string_to_sign(request, signer.canonical_request(request)), request
        )
        seen["region"] = region
        return "sigv4" if hmac.compare_digest(expected, signature) else None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in ("/health", "/control"):
            return await inner(scope, receive, send)
        if scope["path"] == "/stats":
            return await stats_with(inner, scope, receive, send, seen)
        route = _ROUTE.match(scope["raw_path"].decode())
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        raw = await read_body(receive)
        if route is None:
            return await send_json(send, *refusal(404, "Not found"))
        how = verify(scope, headers, raw)
        if how is None:
            message = "The request signature we calculated does not match the one you provided."
            return await send_json(send, *refusal(403, message))
        model, verb = unquote(route.group(1)), route.group(2)
        _CONVERSING.set(verb in CONVERSE)
        if verb in CONVERSE:  # the body as sent: fake_converse reads it as Bedrock does
            seen.update(model=model, verb=verb, auth=how)
            return await inner(scope, replayed(raw), _named(send))
        body = msgspec.json.decode(raw)
        if verb == "count-tokens":
            body = msgspec.json.decode(base64.b64decode(body["input"]["invokeModel"]["body"]))
        if body.pop("anthropic_version", None) != VERSION or "model" in body or "stream" in body:
            message = "Malformed input request: extraneous key, or no anthropic_version"
            return await send_json(send, *refusal(400, message))
        seen.update(model=model, verb=verb, auth=how)
        if verb == "count-tokens":
            body = {
                k: v for k, v in body.items() if k in ("messages", "system", "tools", "tool_choice")
            }
        inner_body = {**body, "model": model} | (
            {"stream": True} if verb.endswith("stream") else {}
        )
        path = "/v1/messages/count_tokens" if verb == "count-tokens" else "/v1/messages"
        inner_headers = [(b"x-api-key", b"inner"), (b"anthropic-version", b"2023-06-01")]
        inner_headers.append((b"content-type", b"application/json"))
        await _relay(
            inner, {**scope, "path": path, "headers": inner_headers}, inner_body, verb, send
        )

    return app


async def _relay(
    inner: Any, scope: dict[str, Any], body: dict[str, Any], verb: str, send: Any
) -> None:
    """fake_anthropic's answer, as Bedrock gives it."""
    status, pending, streaming = 200, b"", False

    async def bedrock_send(message: dict[str, Any]) -> None:
        nonlocal status, pending, streaming
        if message["type"] == "http.response.start":
            status = message["status"]
            streaming = status == 200 and verb == "invoke-with-response-stream"
            if streaming:
                kind = [(b"content-type", b"application/vnd.amazon.eventstream")]
                await send({"type": "http.response.start", "status": 200, "headers": kind})
            return
        pending += message.get("body", b"")
        if not streaming:
            if message.get("more_body"):
                return
            answer = msgspec.json.decode(pending)
            if status != 200:
                error = answer.get("error") or {}
                code = 503 if status == 529 else status
                return await send_json(send, *refusal(code, error.get("message", "refused")))
            if verb == "count-tokens":
                answer = {"inputTokens": answer["input_tokens"]}
            return await send_json(send, 200, answer)
        *events, pending = pending.split(b"\n\n")
        out = b""
        for block in events:
            data = next(
                (line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")), b""
            )
            event = msgspec.json.decode(data) if data else {}
            if event.get("type") == "error":
                kind = STREAM_EXCEPTIONS.get(event["error"]["type"], "internalServerException")
                headers = {":message-type": "exception", ":exception-type": kind}
                out += frame(headers, msgspec.json.encode({"message": event["error"]["message"]}))
            elif event.get("type") != "ping":
                out += event_frame(data)
        await send(
            {
                "type": "http.response.body",
                "body": out,
                "more_body": message.get("more_body", False),
            }
        )

    await inner(scope, replayed(msgspec.json.encode(body)), bedrock_send)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a fake Amazon Bedrock for tests")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--access-key", required=True)
    parser.add_argument("--secret-key", required=True)
    parser.add_argument("--api-key", default="")
    args = parser.parse_args()
    import uvicorn

    app = make_app(args.access_key, args.secret_key, args.api_key)
    uvicorn.run(app, host="127.0.0.1", port=args.port, access_log=False, log_level="critical")
