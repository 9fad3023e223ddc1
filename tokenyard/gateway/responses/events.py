"""A streamed chat completion as the Responses API's typed events.

`response.created`, `response.in_progress` (a background response: `response.created` and
`response.queued` when it is queued, `response.in_progress` when its walk starts), then per
output item `response.output_item.added`, for text `response.content_part.added`,
`response.output_text.delta`s, `response.output_text.done` and `response.content_part.done`, for
a function call `response.function_call_arguments.delta`s and `.done`, then
`response.output_item.done`; last `response.completed` (or `.incomplete`, or `error` and
`response.failed`). Every event carries its `sequence_number`, from 0.
"""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from litestar.response import Stream

from tokenyard.backends import sse
from tokenyard.gateway.responses.translate import (
    Turn,
    adopt,
    call_item,
    message_item,
    new_id,
    response_object,
)

# the events a stored response is saved at
ENDINGS = ("response.completed", "response.incomplete")

# what a finished response is handed to before its last event goes out: stored, and added to its
# conversation
Keep = Callable[[Turn, dict[str, Any]], Awaitable[None]]


def sse_event(event: dict[str, Any]) -> bytes:
    """One event as OpenAI sends it: named by its type."""
    name = str(event.get("type", "")).encode()
    return b"event: " + name + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


class EventWriter:
    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.sequence = 0
        self.text: list[str] | None = None  # the open message item's text
        self.logprobs: list[dict[str, Any]] = []  # its tokens' logprobs, where asked for
        self.unsent: list[dict[str, Any]] = []  # logprobs of tokens whose text is still to come
        self.message_index = -1
        self.calls: dict[int, int] = {}  # chat tool call index → output index
        self.open_call: int | None = None  # output index of the call receiving arguments
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None  # why the stream failed, once it has

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(event)

    def start(self) -> bytes:
        return self._event("response.created", response=self._now("in_progress")) + self.resumed()

    def queued(self) -> bytes:
        """A background response's first events, sent when it is queued."""
        response = self._now("queued")
        return self._event("response.created", response=response) + self._event(
            "response.queued", response=response
        )

    def resumed(self) -> bytes:
        """A queued response's walk has started."""
        return self._event("response.in_progress", response=self._now("in_progress"))

    def _now(self, status: str) -> dict[str, Any]:
        return response_object(self.turn, status)

    def chunk(self, data: dict[str, Any]) -> bytes:
        """The events for one chat.completion.chunk."""
        out = b""
        if data.get("usage"):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            # a token's text may come a chunk later than its logprob (a character in parts)
            self.unsent += (choice.get("logprobs") or {}).get("content") or []
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _text(self, delta: str) -> bytes:
        out = b""
        if self.text is None:
            out += self._close_call()
            self.text = []
            self.message_index = len(self.turn.output)
            item = message_item(new_id("msg"), "", "in_progress")
            self.turn.output.append(item)
            out += self._event(
                "response.output_item.added", output_index=self.message_index, item=item
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.message_index,
                content_index=0,
                part=part,
            )
        self.text.append(delta)
        logprobs, self.unsent = self.unsent, []
        self.logprobs += logprobs
        item_id = self.turn.output[self.message_index]["id"]
        return out + self._event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=self.message_index,
            content_index=0,
            delta=delta,
            logprobs=logprobs,
        )

    def _close_text(self) -> bytes:
        if self.text is None:
            return b""
        # logprobs of last tokens with no text of their own (the end of turn) go in a delta of
        # no text, so that the deltas' logprobs still add up to the done event's
        out = self._text("") if self.unsent else b""
        index, text = self.message_index, "".join(self.text)
        logprobs, self.logprobs = self.logprobs, []
        self.text = None
        item = self.turn.output[index] = message_item(
            self.turn.output[index]["id"], text, "completed", logprobs
        )
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (
            out
            + self._event("response.output_text.done", **where, text=text, logprobs=logprobs)
            + self._event("response.content_part.done", **where, part=item["content"][0])
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        if index not in self.calls:
            out += self._close_text() + self._close_call()
            self.calls[index] = self.open_call = len(self.turn.output)
            item = call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                function.get("name") or "",
                "",
                "in_progress",
            )
            self.turn.output.append(item)
            out += self._event("response.output_item.added", output_index=self.open_call, item=item)
        position = self.calls[index]
        item = self.turn.output[position]
        if function.get("name") and not item["name"]:
            item["name"] = function["name"]
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=position,
                delta=function["arguments"],
            )
        return out

    def _close_call(self) -> bytes:
        if self.open_call is None:
            return b""
        index, self.open_call = self.open_call, None
        item = self.turn.output[index]
        item["status"] = "completed"
        return self._event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=index,
            name=item["name"],
            arguments=item["arguments"],
        ) + self._event("response.output_item.done", output_index=index, item=item)

    def finish(self) -> tuple[dict[str, Any], bytes]:
        """Close what is open: the final Response and the events that end the stream."""
        out = self._close_text() + self._close_call()
        response = response_object(self.turn, "completed", self.finish_reason, self.usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return response, out + self._event(kind, response=response)

    def failed(self, message: str, code: str, refused: bool = False) -> bytes:
        """The upstream broke mid-stream (or, `refused`, the walk was refused: a limit, the
        upstream's 4xx): OpenAI's `error` event, then `response.failed`, whose error carries the
        refusal's own code, as a background response's does when it is not streamed."""
        self.error = error = {
            "code": code if refused and code else "server_error",
            "message": message,
        }
        response = response_object(self.turn, "failed", error=error)
        return self._event("error", code=code, message=message, param=None) + self._event(
            "response.failed", response=response
        )


async def _payloads(reply: Stream) -> AsyncIterator[Any]:
    """The walk's event stream as decoded `data:` payloads, `[DONE]` as None."""
    chunks = reply.iterator.__aiter__()  # type: ignore[union-attr]
    try:
        async for event in sse.events(chunks):
            yield None if event.data == b"[DONE]" else msgspec.json.decode(event.data)
    finally:
        await chunks.aclose()  # the walk's stream settles when closed


def _lost(data: Any) -> dict[str, Any] | None:
    """The walk's own event for an upstream lost mid-stream (an OpenAI error body)."""
    if isinstance(data, dict) and "type" not in data and isinstance(data.get("error"), dict):
        return data["error"]
    return None


async def chat_events(
    writer: EventWriter, reply: Stream, keep: Keep, queued: bool = False
) -> AsyncIterator[bytes]:
    """A chat stream as Responses events, from the writer's first ones (`queued`: a background
    response's walk, which sent those itself). The walk's stream settles before it sends its
    closing `[DONE]`, and the response is kept before `response.completed`: a follow-up by
    previous_response_id can be sent as soon as the client sees the end."""
    if not queued:
        yield writer.start()
    async for data in _payloads(reply):
        if data is None:
            response, tail = writer.finish()
            await keep(writer.turn, response)
            yield tail
            return
        if (error := _lost(data)) is not None:
            yield writer.failed(error.get("message", ""), error.get("code") or "")
            return
        if out := writer.chunk(data):
            yield out
    yield writer.failed("the model's stream ended early", "upstream_error")


async def native_events(
    writer: EventWriter, reply: Stream, keep: Keep, queued: bool = False
) -> AsyncIterator[bytes]:
    """OpenAI's own Responses events, under the gateway's response id and numbered on from the
    writer's; kept, as above, before the final event goes out. `queued`: after a background
    response's own `response.created` and `response.in_progress`, which stand for the
    upstream's."""
    async for data in _payloads(reply):
        if data is None:
            continue
        if (error := _lost(data)) is not None:
            yield writer.failed(error.get("message", ""), error.get("code") or "")
            return
        if isinstance(data.get("response"), dict):
            adopt(writer.turn, data["response"])
            if data.get("type") in ENDINGS:
                await keep(writer.turn, data["response"])
        if queued and data.get("type") in ("response.created", "response.in_progress"):
            continue
        data["sequence_number"] = writer.sequence
        writer.sequence += 1
        yield sse_event(data)
