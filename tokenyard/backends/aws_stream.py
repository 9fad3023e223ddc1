"""AWS's binary event-stream framing, as Bedrock streams (length-prefixed, CRC-checked frames,
parsed by botocore): each frame's kind, type and JSON payload."""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Frame:
    kind: str  # event, exception or error
    name: str  # the event's or exception's type ("chunk", "throttlingException")
    payload: dict[str, Any]
    message: str  # an exception's or error's words


class FrameError(Exception):
    """A frame cut or corrupted: its CRC or lengths do not add up."""


async def frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[Frame]:
    from botocore.eventstream import EventStreamBuffer, ParserError  # only Bedrock loads it

    buffer = EventStreamBuffer()
    async for data in chunks:
        buffer.add_data(data)
        try:
            parsed = list(buffer)
        except ParserError as exc:
            raise FrameError(f"event stream: {exc}") from exc
        for frame in parsed:
            headers = frame.headers
            kind = str(headers.get(":message-type", ""))
            name = headers.get(":event-type") or headers.get(":exception-type")
            name = str(name or headers.get(":error-code", ""))
            payload = json.loads(frame.payload or b"{}")
            message = payload.get("message") or headers.get(":error-message", name)
            yield Frame(kind, name, payload, str(message))
