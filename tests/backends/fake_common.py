"""What the fake OpenAI and Anthropic servers share: ASGI plumbing, prompt directives, fault state,
the control and stats endpoints, multipart forms, and the command line.

Directives are `#name=value` words in the prompt text (all messages' text, or the prompt):
  #status=C            refuse with HTTP C, in the API's error shape
  #retry_after=S       with #status: a Retry-After header of S seconds
  #times=N             #status and #first_byte_delay apply to the first N requests carrying this
                       same prompt text only (so a retried request then succeeds)
  #first_byte_delay=S  wait S seconds before the response starts
  #delay=S             seconds between streamed events (non-streamed: before the reply)
  #chunks=N            content pieces to generate (default 5)
  #cut=K               streamed: drop the connection after K events
  #tool                call the first tool the request offers (arguments {"city": "Paris"})
  #cached=K            report K prompt tokens as read from the prompt cache
  #written=K           report K prompt tokens as written to the prompt cache (Anthropic only)
  #stream_error=K      (Anthropic) streamed: an `error` event (overloaded_error) after K events
Control: POST /control {"fail_next": N, "status": C, "retry_after": S} refuses the next N requests
with C (default 500); POST /control {"reset": true} clears the counters. GET /stats: requests seen,
the last request's body and headers, per-prompt counts. GET /health: 200.
"""

import argparse
import asyncio
import email.parser
import email.policy
import io
import re
import wave
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
_DIRECTIVE = re.compile(
    r"#(status|retry_after|times|first_byte_delay|delay|chunks|cut|cached|written|stream_error)"
    r"=([0-9.]+)"
    r"|#(tool|echo)\b"
)


class Cut(Exception):
    """Raised inside a streamed response: the server drops the connection mid-body."""


@dataclass
class Directives:
    status: int | None = None
    retry_after: float | None = None
    first_byte_delay: float = 0.0
    delay: float = 0.0
    chunks: int = 5
    cut: int | None = None
    cached: int = 0
    written: int = 0
    tool: bool = False
    echo: bool = False  # the reply is the prompt's words (the Responses API's), one a piece
    stream_error: int | None = None


def directives(text: str, seen: int) -> Directives:
    """The directives in a prompt; `seen`: how many requests carried this prompt before."""
    found: dict[str, str] = {}
    for name, value, flag in _DIRECTIVE.findall(text):
        found[name or flag] = value or "1"
    d = Directives(
        delay=float(found.get("delay", 0)),
        chunks=int(float(found.get("chunks", 5))),
        cut=int(float(found["cut"])) if "cut" in found else None,
        cached=int(float(found.get("cached", 0))),
        written=int(float(found.get("written", 0))),
        tool="tool" in found,
        echo="echo" in found,
        stream_error=int(float(found["stream_error"])) if "stream_error" in found else None,
        retry_after=float(found["retry_after"]) if "retry_after" in found else None,
    )
    if "times" not in found or seen < int(float(found["times"])):
        d.status = int(float(found["status"])) if "status" in found else None
        d.first_byte_delay = float(found.get("first_byte_delay", 0))
    return d


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


@dataclass
class State:
    requests: int = 0
    last_body: Any = None
    last_headers: dict[str, str] = field(default_factory=dict)
    last_path: str = ""
    prompts: dict[str, int] = field(default_factory=dict)  # prompt text → requests seen
    fail_next: int = 0
    fail_status: int = 500
    fail_retry_after: float | None = None


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def form_fields(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart form: its text fields by name (a repeated one as a list), its file as
    {"filename", "content_type", "size", "seconds"} (seconds: a WAV file's length, else None).
    ValueError: not a multipart form."""
    head = f"content-type: {content_type}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    if not message.is_multipart():
        raise ValueError("not a multipart form")
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if part.get_filename() is not None:
            seconds = None
            try:
                with wave.open(io.BytesIO(data)) as audio:
                    seconds = audio.getnframes() / audio.getframerate()
            except (wave.Error, EOFError):
                pass
            kind = part.get_content_type()
            value: Any = {"filename": part.get_filename(), "content_type": kind}
            value |= {"size": len(data), "seconds": seconds}
        else:
            value = data.decode()
        if name in fields:
            held = fields[name]
            fields[name] = [*held, value] if isinstance(held, list) else [held, value]
        else:
            fields[name] = value
    return fields


async def send_bytes(send: Send, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, data: Any, headers: dict[str, str] | None = None
) -> None:
    pairs = [(b"content-type", b"application/json")]
    pairs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": msgspec.json.encode(data)})


async def start_sse(send: Send) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})


# an API handler: (path, body, headers, directives, send) → None
Handler = Callable[[str, dict[str, Any], dict[str, str], Directives, Send], Awaitable[None]]
# the error reply in the API's shape: (status, message) → body
ErrorShape = Callable[[int, str], dict[str, Any]]


def make_asgi(handler: Handler, error: ErrorShape, prompt: Callable[[dict[str, Any]], str]) -> Any:
    state = State()

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].split(".")[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/health":
                return await send_json(send, 200, {"status": "ok"})
            if path == "/stats":
                return await send_json(send, 200, state.__dict__)
            return await send_json(send, 404, error(404, f"no route {path}"))
        raw = await read_body(receive)
        if path == "/control":
            control = msgspec.json.decode(raw)
            if control.get("reset"):
                state.__init__()  # type: ignore[misc]
            state.fail_next = control.get("fail_next", state.fail_next)
            state.fail_status = control.get("status", 500)
            state.fail_retry_after = control.get("retry_after")
            return await send_json(send, 200, {"fail_next": state.fail_next})
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        content_type = headers.get("content-type", "")
        try:
            if content_type.startswith("multipart/form-data"):
                body = form_fields(raw, content_type)
            else:
                body = msgspec.json.decode(raw)
        except (msgspec.DecodeError, ValueError):
            return await send_json(send, 400, error(400, "the body is not valid JSON or a form"))
        state.requests += 1
        state.last_body, state.last_headers, state.last_path = body, headers, path
        text = prompt(body)
        seen = state.prompts.get(text, 0)
        state.prompts[text] = seen + 1
        d = directives(text, seen)
        if state.fail_next > 0:
            state.fail_next -= 1
            d.status, d.retry_after = state.fail_status, state.fail_retry_after
        if d.first_byte_delay:
            await asyncio.sleep(d.first_byte_delay)
        if d.status is not None:
            extra = {"retry-after": f"{d.retry_after:g}"} if d.retry_after is not None else {}
            return await send_json(send, d.status, error(d.status, "refused (#status)"), extra)
        await handler(path, body, headers, d, send)

    return app


def replayed(payload: bytes) -> Receive:
    """An ASGI receive that gives a body already read (rewritten by a wrapping fake), once."""
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:
            return {"type": "http.disconnect"}
        given = True
        return {"type": "http.request", "body": payload, "more_body": False}

    return receive


async def stats_with(
    inner: Any, scope: Any, receive: Any, send: Send, extra: dict[str, str]
) -> None:
    """A wrapped fake's /stats (`inner`'s figures) with the wrapper's own added."""
    captured: list[dict[str, Any]] = []

    async def keep(message: dict[str, Any]) -> None:
        captured.append(message)

    await inner(scope, receive, keep)
    figures = msgspec.json.decode(b"".join(m.get("body", b"") for m in captured[1:]))
    await send_json(send, 200, {**figures, **extra})


async def pace(d: Directives, sent: int) -> None:
    """Before a streamed event: the #delay, and the #cut after `sent` events."""
    if d.cut is not None and sent >= d.cut:
        raise Cut(f"cut after {sent} events (#cut)")
    if d.delay:
        await asyncio.sleep(d.delay)


def main(make_app: Callable[[], Any], description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    import uvicorn

    uvicorn.run(make_app(), host=args.host, port=args.port, access_log=False, log_level="critical")
