"""A streamed chat completion as the Responses API's typed events.

`response.created`, `response.in_progress`, then per output item `response.output_item.added`,
for text `response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`
and `response.content_part.done`, for a function call `response.function_call_arguments.delta`s and
`.done`, then `response.output_item.done`; last `response.completed` (or `.incomplete`, or `error`
and `response.failed`). Every event carries its `sequence_number`, from 0.
"""

from typing import Any

import msgspec

from tokenyard.gateway.responses.translate import (
    Turn,
    call_item,
    message_item,
    new_id,
    response_object,
)

# the events a stored response is saved at
ENDINGS = ("response.completed", "response.incomplete")


def sse_event(event: dict[str, Any]) -> bytes:
    """One event as OpenAI sends it: named by its type."""
    name = str(event.get("type", "")).encode()
    return b"event: " + name + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


class EventWriter:
    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.sequence = 0
        self.text: list[str] | None = None  # the open message item's text
        self.message_index = -1
        self.calls: dict[int, int] = {}  # chat tool call index → output index
        self.open_call: int | None = None  # output index of the call receiving arguments
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(event)

    def start(self) -> bytes:
        response = response_object(self.turn, "in_progress")
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def chunk(self, data: dict[str, Any]) -> bytes:
        """The events for one chat.completion.chunk."""
        out = b""
        if data.get("usage"):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
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
        item_id = self.turn.output[self.message_index]["id"]
        return out + self._event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=self.message_index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def _close_text(self) -> bytes:
        if self.text is None:
            return b""
        index, text = self.message_index, "".join(self.text)
        self.text = None
        item = self.turn.output[index] = message_item(
            self.turn.output[index]["id"], text, "completed"
        )
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (
            self._event("response.output_text.done", **where, text=text, logprobs=[])
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

    def failed(self, message: str, code: str) -> bytes:
        """The upstream broke mid-stream: OpenAI's `error` event, then `response.failed`."""
        error = {"code": "server_error", "message": message}
        response = response_object(self.turn, "failed", error=error)
        return self._event("error", code=code, message=message, param=None) + self._event(
            "response.failed", response=response
        )
