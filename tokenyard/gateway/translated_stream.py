"""The gateway's chat stream as another protocol's events (Anthropic's Messages, Google's Gemini):
each chunk handed to that protocol's writer, the end and a stream lost midway in its own form."""

from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec
from litestar.response import Stream

from tokenyard.backends.sse import Splitter


class Writer(Protocol):
    def chunk(self, data: dict[str, Any]) -> bytes: ...

    def finish(self) -> bytes: ...

    def failed(self, status: int, message: str) -> bytes: ...


async def translated(reply: Stream, writer: Writer) -> AsyncIterator[bytes]:
    """The walk settles before its closing `[DONE]`, so the request is billed before the client
    sees the end of the stream in its own protocol."""
    splitter = Splitter()
    chunks = reply.iterator.__aiter__()  # type: ignore[union-attr]
    try:
        async for piece in chunks:
            for block in splitter.feed(piece):
                payload = block.removeprefix(b"data:").strip()
                if payload == b"[DONE]":
                    yield writer.finish()
                    return
                data = msgspec.json.decode(payload)
                if "error" in data:  # the walk's own event for an upstream lost mid-stream
                    yield writer.failed(502, str(data["error"].get("message", "")))
                    return
                if out := writer.chunk(data):
                    yield out
        yield writer.failed(502, "the model's stream ended early")
    finally:
        await chunks.aclose()
