"""Anthropic's Messages API in front of any model: a Messages request → an OpenAI chat body, and the
chat reply (whole, or its chunks) → an Anthropic Message (or its stream events), errors included.

The reverse of anthropic_wire.py, built on its tables and block conversions (finish reasons, error
types, tool calls ⇄ tool_use blocks, tool_choice, usage), so the two directions cannot drift apart.
Pure functions and one stream writer, no I/O: gateway/messages.py runs the walk between them.
"""

from dataclasses import dataclass, field
from typing import Any

from tokenyard.backends import sse
from tokenyard.backends.anthropic_wire import (
    ERRORS,
    FINISH,
    THINKING_BLOCKS,
    TOOL_CHOICE,
    signed_thinking,
    tool_call,
    tool_use_block,
)
from tokenyard.core.errors import GatewayError, refusal_message

# OpenAI finish reason → Anthropic stop reason: the first Anthropic reason that maps to it
STOP = {openai: anthropic for anthropic, openai in reversed(FINISH.items())}
# HTTP status → Anthropic error type (529 "overloaded" is also what a saturated gateway's 503 is)
ERROR_TYPES = {status: kind for kind, (status, _) in ERRORS.items()} | {503: "overloaded_error"}
_CHOICE = {anthropic: openai for openai, anthropic in TOOL_CHOICE.items()}


def _bad(message: str, param: str = "messages") -> GatewayError:
    return GatewayError(400, message, param=param)


def _text(content: Any, where: str) -> str:
    """A system prompt or tool result: a string, or text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content blocks")
    texts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where} takes text blocks only")
        texts.append(str(block.get("text", "")))
    return "\n".join(texts)


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"
    if source.get("type") == "url":
        return str(source.get("url", ""))
    raise _bad(f"image source type {source.get('type')!r} is not supported")


def _turn(role: str, content: Any) -> list[dict[str, Any]]:
    """One Anthropic turn → OpenAI messages: a user turn's tool results become `tool` messages
    (before its other content, as Anthropic requires them first), an assistant's tool_use blocks
    its tool_calls, its thinking blocks the message's `thinking_blocks` (LiteLLM's field, which
    the Anthropic backend sends back first). Unsigned thinking, which another provider's reasoning
    became in a reply here, is dropped: Anthropic would refuse it, and no other model reads it."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad("a message's content must be a string or a list of content blocks")
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    thought: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image" and role == "user":
            url = _image_url(block.get("source") or {})
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use" and role == "assistant":
            call = tool_call(0, block)
            del call["index"]  # only stream deltas carry one
            calls.append(call)
        elif kind == "tool_result" and role == "user":
            text = _text(block.get("content") or "", "a tool_result's content")
            if block.get("is_error"):
                text = f"(error) {text}"
            results.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}
            )
        elif kind in THINKING_BLOCKS and role == "assistant":
            if signed_thinking(block):
                thought.append(block)
        else:
            raise _bad(f"content block type {kind!r} is not supported in a {role} turn")
    out = list(results)
    if calls:
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
    elif parts or not results:
        only_text = all(p["type"] == "text" for p in parts)
        joined = "".join(p["text"] for p in parts) if only_text else parts
        out.append({"role": role, "content": joined})
    if thought:
        out[-1]["thinking_blocks"] = thought
    return out


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    """Anthropic tool_choice → (OpenAI tool_choice, parallel_tool_calls)."""
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}, parallel
    if kind in _CHOICE:
        return _CHOICE[kind], parallel
    raise _bad(f"tool_choice type {kind!r} is not supported", "tool_choice")


def chat_request(body: Any) -> dict[str, Any]:
    """An Anthropic Messages body → an OpenAI chat.completions body (checked)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "body")
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            raise _bad(f"{name}: Field required", name)
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _bad("max_tokens must be a positive integer", "max_tokens")
    if not isinstance(body["model"], str):
        raise _bad("model must be a string", "model")
    turns = body["messages"]
    if not isinstance(turns, list) or not turns:
        raise _bad("messages must be a non-empty list")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    for turn in turns:
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ("user", "assistant"):
            raise _bad("each message's role must be 'user' or 'assistant'")
        messages += _turn(role, turn.get("content"))
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": bool(body.get("stream")),
    }
    if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        # a prefill: the answer goes on from the assistant's words (vLLM's field for it), and
        # only what follows them is the reply, as Anthropic answers
        out["continue_final_message"] = True
    if out["stream"]:  # message_delta reports the usage: the chat stream must end with it
        out["stream_options"] = {"include_usage": True}
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    for name in ("temperature", "top_p", "top_k", "thinking", "output_config"):
        if body.get(name) is not None:
            out[name] = body[name]
    user = (body.get("metadata") or {}).get("user_id")
    if user:
        out["user"] = str(user)
    if body.get("tools"):
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.get("name", ""),
                    **({"description": tool["description"]} if tool.get("description") else {}),
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for tool in body["tools"]
        ]
    if body.get("tool_choice"):
        choice, parallel = _tool_choice(body["tool_choice"])
        out["tool_choice"] = choice
        if parallel is not None:
            out["parallel_tool_calls"] = parallel
    return out


def anthropic_usage(raw: dict[str, Any] | None) -> dict[str, int]:
    """OpenAI usage → Anthropic's: its input_tokens leave out those read from the cache and
    those written to it."""
    raw = raw or {}
    details = raw.get("prompt_tokens_details") or {}
    cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    return {
        "input_tokens": max((raw.get("prompt_tokens") or 0) - cached - written, 0),
        "output_tokens": raw.get("completion_tokens") or 0,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }


def message_id(openai_id: str) -> str:
    return "msg_" + openai_id.removeprefix("chatcmpl-")


def message_reply(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat.completion → an Anthropic Message."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content = _thought(message)
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    content += [tool_use_block(call) for call in message.get("tool_calls") or []]
    return {
        "id": message_id(str(reply.get("id", ""))),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **stopped(choice),
        "usage": anthropic_usage(reply.get("usage")),
    }


def _thought(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A reply's thinking blocks: Anthropic's as its model signed them, another provider's
    reasoning_content as one unsigned block (shown, not to be sent back)."""
    if message.get("thinking_blocks"):
        return list(message["thinking_blocks"])
    if message.get("reasoning_content"):
        return [{"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}]
    return []


def stopped(choice: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's stop_reason and stop_sequence for a finished chat choice: a stop string the
    choice names as its `stop_reason` (vLLM's field, which the engine and the Anthropic backend
    give) is a `stop_sequence`."""
    matched = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(matched, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    reason = STOP.get(choice.get("finish_reason") or "stop", "end_turn")
    return {"stop_reason": reason, "stop_sequence": None}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_from_openai(status: int, raw: bytes) -> dict[str, Any]:
    """An OpenAI-shaped refusal (the gateway's or an upstream's) → Anthropic's error body."""
    return error_body(status, refusal_message(raw))


def event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\n".encode() + sse.data({"type": kind, **data})


@dataclass
class EventWriter:
    """OpenAI chat.completion.chunk events → Anthropic's stream: message_start, per content block
    content_block_start / _delta / _stop, message_delta (stop reason, usage), message_stop. The
    usage chunk comes after the finish chunk, so the message closes at the stream's end."""

    model: str
    id: str = ""
    started: bool = False
    block: int = -1  # index of the open content block (-1: none)
    block_kind: str = ""  # thinking, text, or tool_use
    tools: dict[int, int] = field(default_factory=dict)  # OpenAI tool call index → block index
    stop: dict[str, Any] = field(
        default_factory=lambda: {"stop_reason": "end_turn", "stop_sequence": None}
    )
    usage: dict[str, Any] | None = None

    def _start(self, openai_id: str) -> bytes:
        self.started = True
        self.id = message_id(openai_id)
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # counted by the model as it finishes: message_delta carries them
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"message": message})

    def _close(self) -> bytes:
        if self.block < 0 or not self.block_kind:
            return b""
        self.block_kind = ""
        return event("content_block_stop", {"index": self.block})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.block += 1
        self.block_kind = kind
        return out + event("content_block_start", {"index": self.block, "content_block": block})

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        at = self.block if index is None else index
        return event("content_block_delta", {"index": at, "delta": delta})

    def _thinking(self, text: str) -> bytes:
        out = b""
        if self.block_kind != "thinking":
            out = self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return out + (self._delta({"type": "thinking_delta", "thinking": text}) if text else b"")

    def _thought(self, block: dict[str, Any]) -> bytes:
        """A whole thinking block, which the chat stream gives as its thinking ends: its signature
        closes the block streamed so far (its text too, where none was streamed); a redacted one
        is a block of its own."""
        if block.get("type") == "redacted_thinking":
            return self._open("redacted_thinking", dict(block)) + self._close()
        streamed = self.block_kind == "thinking"
        out = self._thinking("" if streamed else str(block.get("thinking", "")))
        if block.get("signature"):
            out += self._delta({"type": "signature_delta", "signature": block["signature"]})
        return out + self._close()

    def chunk(self, data: dict[str, Any]) -> bytes:
        """The Anthropic events for one OpenAI chunk (b"" for none)."""
        self.model = data.get("model") or self.model  # the model that served it (auto's pick)
        out = b"" if self.started else self._start(str(data.get("id", "")))
        if data.get("usage"):
            self.usage = data["usage"]
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._thinking(delta["reasoning_content"])
            for block in delta.get("thinking_blocks") or []:
                out += self._thought(block)
            if delta.get("content"):
                if self.block_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                function = call.get("function") or {}
                if index not in self.tools:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "input": {},
                    }
                    out += self._open("tool_use", block)
                    self.tools[index] = self.block
                if function.get("arguments"):
                    json_delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
                    out += self._delta(json_delta, self.tools[index])
            if choice.get("finish_reason"):
                self.stop = stopped(choice)
        return out

    def finish(self) -> bytes:
        """The message's end: the open block closed, the stop reason and the usage."""
        out = (b"" if self.started else self._start("")) + self._close()
        usage = anthropic_usage(self.usage) if self.usage else {"output_tokens": 0}
        out += event("message_delta", {"delta": self.stop, "usage": usage})
        return out + event("message_stop", {})

    def failed(self, status: int, message: str) -> bytes:
        return event("error", {"error": error_body(status, message)["error"]})
