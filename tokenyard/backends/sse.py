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


class Splitter:
    """Splits SSE bytes, read in arbitrary pieces, into event blocks with "\n" line ends. Lines may
    end in CRLF, LF or a bare CR (the spec allows all three), and a CRLF may be split across two
    reads: the CR then ends the first read, and the LF that starts the next is the same line end."""

    def __init__(self) -> None:
        self.rest = b""  # an event not yet ended by a blank line
        self._after_cr = False

    def feed(self, data: bytes) -> list[bytes]:
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = data.endswith(b"\r")
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self.rest += data
        if b"\n\n" not in self.rest:
            return []
        *blocks, self.rest = self.rest.split(b"\n\n")
        return [block for block in blocks if block]


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[Event]:
    splitter = Splitter()
    async for chunk in chunks:
        for block in splitter.feed(chunk):
            if (event := _parse(block)) is not None:
                yield event
    if splitter.rest.strip() and (event := _parse(splitter.rest)) is not None:
        yield event


def data(payload: Any) -> bytes:
    """One `data:` event holding JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"
