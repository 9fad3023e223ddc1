"""Server-sent events: split a byte stream into events, and write them."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec


@dataclass
class Event:
    name: str  # the `event:` field; "" when absent (OpenAI's streams have none)
    data: bytes  # the `data:` lines joined


def _parse(block: bytes) -> Event | None:
    name, data = "", []
    for line in block.split(b"\n"):
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"event":
            name = value.decode()
        elif field == b"data":
            data.append(value)
    return Event(name, b"\n".join(data)) if data or name else None


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[Event]:
    buffer = b""
    async for chunk in chunks:
        buffer += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        *blocks, buffer = buffer.split(b"\n\n")
        for block in blocks:
            if (event := _parse(block)) is not None:
                yield event
    if buffer.strip() and (event := _parse(buffer)) is not None:
        yield event


def data(payload: Any) -> bytes:
    """One `data:` event holding JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"
