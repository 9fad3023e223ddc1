"""The one SSE splitter (backends/sse.py), read by the commercial backends' decoder and the
gateway's relay: every split point of a recorded stream, in every line-end style, gives the same
events."""

from collections.abc import AsyncIterator

import pytest

from tokenyard.backends.base import BufferedStream
from tokenyard.backends.sse import events
from tokenyard.gateway.streaming import StreamResult, relay

# a stream as an OpenAI-compatible server sends it: two chunks, a comment, a usage chunk, the end
RECORDED = [
    b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
    b": keep-alive",
    b'event: message\ndata: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":'
    b'"stop"}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
    b"data: [DONE]",
]


def framed(line_end: bytes) -> bytes:
    return b"".join(block.replace(b"\n", line_end) + line_end * 2 for block in RECORDED)


async def pieces(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def decoded(*chunks: bytes) -> list[tuple[str, bytes]]:
    return [(e.name, e.data) async for e in events(pieces(*chunks))]


class _Stream(BufferedStream):
    def __init__(self, chunks: list[bytes]) -> None:
        super().__init__(200, b"")
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


async def relayed(chunks: list[bytes]) -> tuple[bytes, StreamResult]:
    result = StreamResult()
    out = [piece async for piece in relay(_Stream(chunks), True, result, lambda: 0.0)]
    return b"".join(out), result


async def test_the_issue_example_is_two_events() -> None:
    got = await decoded(b'data: {"a":1}\r\n\r', b'\ndata: {"b":2}\r\n\r\n')
    assert got == [("", b'{"a":1}'), ("", b'{"b":2}')]


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
async def test_every_split_point_gives_the_same_events(line_end: bytes) -> None:
    wire = framed(line_end)
    whole = await decoded(wire)
    assert len(whole) == 4  # the comment is no event
    assert whole[1][0] == "message"
    want_relay, want_result = await relayed([wire])
    assert want_result.done and want_result.usage is not None
    assert want_relay == framed(b"\n").replace(b"data: [DONE]\n\n", b"")  # [DONE] held back
    for cut in range(1, len(wire)):
        parts = [wire[:cut], wire[cut:]]
        assert await decoded(*parts) == whole, cut
        assert (await relayed(parts))[0] == want_relay, cut
    one_byte = [wire[i : i + 1] for i in range(len(wire))]
    assert await decoded(*one_byte) == whole
    assert (await relayed(one_byte))[0] == want_relay
