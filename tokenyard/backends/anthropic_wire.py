"""OpenAI chat ⇄ Anthropic Messages translation: requests, replies, stream events and errors.

Pure functions, no I/O: backends/anthropic.py sends what these build.
"""

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tokenyard.backends import sse
from tokenyard.backends.base import StreamRefusal, error_body
from tokenyard.core.errors import GatewayError

# Anthropic requires max_tokens; the gateway always sets it, this is for direct callers and
# token counts (past a thinking budget, where there is one)
DEFAULT_MAX_TOKENS = 4096
# reasoning_effort → extended thinking's budget in tokens (LiteLLM's mapping; 1,024 is
# Anthropic's least); "none" turns thinking off
MIN_THINKING = 1024
THINKING_BUDGET = {"minimal": MIN_THINKING, "low": MIN_THINKING, "medium": 2048, "high": 4096}
# reasoning_effort → the effort of a model that thinks adaptively (Anthropic's output_config)
ADAPTIVE_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high"}
# the blocks of a model's thinking, as a reply carries them and a later turn must send them back
THINKING_BLOCKS = ("thinking", "redacted_thinking")

FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}

# Anthropic error type → (HTTP status, OpenAI error type)
ERRORS = {
    "invalid_request_error": (400, "invalid_request_error"),
    "authentication_error": (401, "authentication_error"),
    "billing_error": (402, "invalid_request_error"),
    "permission_error": (403, "permission_error"),
    "not_found_error": (404, "invalid_request_error"),
    "request_too_large": (413, "invalid_request_error"),
    "rate_limit_error": (429, "rate_limit_error"),
    "api_error": (500, "server_error"),
    "timeout_error": (504, "server_error"),
    "overloaded_error": (529, "server_error"),
}


def _bad(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, code="unsupported_parameter", param=param)


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        head, _, payload = url.partition(",")
        media_type = head[5:].split(";")[0]
        source = {"type": "base64", "media_type": media_type, "data": payload}
        return {"type": "image", "source": source}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any) -> list[dict[str, Any]]:
    """OpenAI message content (a string or parts) → Anthropic content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content:
        if part.get("type") == "text":
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            image = part.get("image_url") or {}
            blocks.append(_image(image if isinstance(image, str) else image.get("url", "")))
        else:
            raise _bad(f"content part type {part.get('type')!r} is not supported", "messages")
    return blocks


def _text(content: Any) -> str:
    return "".join(b["text"] for b in _blocks(content) if b["type"] == "text")


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call → an Anthropic tool_use block."""
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        raise _bad("tool call arguments must be JSON", "messages") from None
    name = function.get("name", "")
    return {"type": "tool_use", "id": call.get("id", ""), "name": name, "input": arguments}


def _messages(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system prompt, turns): consecutive turns of one role merged, as Anthropic requires."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
            continue
        if role == "tool":
            role, blocks = (
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": m.get("tool_call_id", ""),
                        "content": _text(m.get("content")),
                    }
                ],
            )
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            # its thinking first, as the reply gave it (LiteLLM's `thinking_blocks` field)
            thought = [b for b in m.get("thinking_blocks") or [] if signed_thinking(b)]
            blocks = thought + _blocks(m.get("content")) + [tool_use_block(c) for c in calls]
        elif role == "user":
            blocks = _blocks(m.get("content"))
        else:
            raise _bad(f"message role {role!r} is not supported", "messages")
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(s for s in system if s), turns


def _is_thinking(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") in THINKING_BLOCKS


def signed_thinking(block: Any) -> bool:
    """A thinking block a model signed (or a redacted one): one Anthropic's models can check when
    it is sent back. Unsigned thinking, another model's reasoning shown as such, is never sent."""
    return _is_thinking(block) and bool(block.get("signature") or block.get("data"))


def asked_thinking(body: dict[str, Any]) -> dict[str, Any] | None:
    """Anthropic's `thinking` field as asked (the Messages front sends it, LiteLLM's chat field
    too), checked: {type: enabled, budget_tokens ≥ 1,024}, {type: adaptive} (the model decides,
    as Claude Opus 4.6 and later do; Opus 4.7 and Claude 5 take no other) or {type: disabled};
    None where the body has none. A malformed one, or one beside reasoning_effort, is a 400."""
    asked = body.get("thinking")
    if asked is None:
        return None
    if body.get("reasoning_effort") is not None:
        raise _bad("give thinking or reasoning_effort, not both", "thinking")
    kind = asked.get("type") if isinstance(asked, dict) else None
    if kind in ("disabled", "adaptive"):
        return asked
    budget = asked.get("budget_tokens") if kind == "enabled" else None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_THINKING:
        why = (
            "thinking is {type: adaptive}, {type: disabled} or "
            f"{{type: enabled, budget_tokens ≥ {MIN_THINKING}}}"
        )
        raise _bad(why, "thinking")
    return asked


def _asked(body: dict[str, Any], adaptive: bool) -> tuple[dict[str, Any] | None, str]:
    """(the thinking to ask of the model, None for none; the field that asked it). A model that
    thinks adaptively takes reasoning_effort as {type: adaptive} (its effort: _effort)."""
    asked = asked_thinking(body)
    if asked is not None:
        return (None if asked["type"] == "disabled" else asked), "thinking"
    effort = body.get("reasoning_effort")
    if effort in (None, "none"):
        return None, "reasoning_effort"
    if effort not in THINKING_BUDGET:
        why = f"reasoning_effort {effort!r} is not supported by this model"
        raise _bad(why, "reasoning_effort")
    if adaptive:
        return {"type": "adaptive"}, "reasoning_effort"
    return {"type": "enabled", "budget_tokens": THINKING_BUDGET[effort]}, "reasoning_effort"


def _thinking(
    body: dict[str, Any], turns: list[dict[str, Any]], max_tokens: int | None, adaptive: bool
) -> dict[str, Any] | None:
    """The thinking to ask (None: none), or a 400 where Anthropic's rules forbid it: a JSON
    answer or a forced tool (thinking allows no forced tool use), or an output cap that leaves no
    room past a budget. A request that continues a tool call made without thinking, or whose
    thinking the client did not send back, does not think: Anthropic requires a final assistant
    turn that used tools to start with its thinking."""
    thinking, field_name = _asked(body, adaptive)
    if thinking is None:
        return None
    if answers_in_json(body):
        raise _bad(
            f"{field_name} with response_format is not supported by this model", "response_format"
        )
    choice = body.get("tool_choice")
    if isinstance(choice, dict) or choice == "required":
        raise _bad(f"{field_name} allows tool_choice auto or none only", "tool_choice")
    budget = thinking.get("budget_tokens", 0)
    if max_tokens is not None and max_tokens <= budget:
        raise _bad(f"max_tokens must exceed the {budget} thinking tokens", "max_tokens")
    last = next((t for t in reversed(turns) if t["role"] == "assistant"), None)
    if last is not None:
        blocks = last["content"]
        if any(b["type"] == "tool_use" for b in blocks) and not _is_thinking(blocks[0]):
            return None
    return thinking


def _effort(body: dict[str, Any], adaptive: bool) -> dict[str, Any] | None:
    """Anthropic's output_config (its `effort`): as the Messages front sends it, or a model that
    thinks adaptively's from reasoning_effort."""
    given, effort = body.get("output_config"), body.get("reasoning_effort")
    if given is not None and effort is not None:
        raise _bad("give output_config or reasoning_effort, not both", "output_config")
    if given is not None:
        if not isinstance(given, dict):
            raise _bad("output_config must be an object", "output_config")
        return given
    if adaptive and effort in ADAPTIVE_EFFORT:
        return {"effort": ADAPTIVE_EFFORT[effort]}
    return None


# structured outputs as Anthropic's models give them on every cloud: one forced tool whose input
# schema is the format asked, its input the answer (LiteLLM's approach; Anthropic's own
# output_format is a beta on its API alone, and Bedrock's Converse has no other way)
ANSWER_TOOL = "json_answer"


def _answer_tool(wanted: dict[str, Any]) -> dict[str, Any]:
    """The tool that carries a `response_format` of json_schema or json_object."""
    schema: dict[str, Any] = {"type": "object"}
    if wanted.get("type") == "json_schema":
        schema = (wanted.get("json_schema") or {}).get("schema") or schema
    return {
        "name": ANSWER_TOOL,
        "description": "Answer the user, in exactly this JSON structure.",
        "input_schema": schema,
    }


def answers_in_json(body: dict[str, Any]) -> bool:
    """Whether an OpenAI chat body asks for a JSON answer (json_schema or json_object)."""
    return (body.get("response_format") or {}).get("type", "text") != "text"


# OpenAI's tool_choice strings → Anthropic's tool_choice types
TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}


def _tool_choice(choice: Any, parallel: bool | None) -> dict[str, Any] | None:
    if choice is None:
        out = None
    elif isinstance(choice, str) and choice in TOOL_CHOICE:
        out = {"type": TOOL_CHOICE[choice]}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        out = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    else:
        raise _bad("tool_choice is not one Anthropic supports", "tool_choice")
    if parallel is False:
        out = {**(out or {"type": "auto"}), "disable_parallel_tool_use": True}
    return out


def messages_request(body: dict[str, Any], model: str, adaptive: bool = False) -> dict[str, Any]:
    """An OpenAI chat.completions body → an Anthropic Messages body; `adaptive`: the model thinks
    adaptively (the catalog's `thinking = "adaptive"`), so reasoning_effort asks it that way."""
    if (body.get("n") or 1) > 1:
        raise _bad("n > 1 is not supported by this model", "n")
    if body.get("logprobs"):
        raise _bad("logprobs are not supported by this model", "logprobs")
    wanted = body.get("response_format") or {}
    if answers_in_json(body) and body.get("tools"):
        raise _bad("response_format together with tools is not supported by this model", "tools")
    system, turns = _messages(body.get("messages") or [])
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    thinking = _thinking(body, turns, max_tokens, adaptive)
    max_tokens = max_tokens or DEFAULT_MAX_TOKENS + (thinking or {}).get("budget_tokens", 0)
    out: dict[str, Any] = {"model": model, "messages": turns, "max_tokens": max_tokens}
    if system:
        out["system"] = system
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    out["output_config"] = _effort(body, adaptive)
    if thinking is not None:
        # thinking samples as the model does: Anthropic refuses a temperature or top_k with it
        # (as OpenAI's reasoning models refuse them), and a top_p under 0.95; they are left out
        out["thinking"] = thinking
        if (body.get("top_p") or 1.0) >= 0.95:
            out["top_p"] = body.get("top_p")
    else:
        if body.get("temperature") is not None:
            out["temperature"] = min(float(body["temperature"]), 1.0)  # Anthropic's: 0..1
        for name in ("top_p", "top_k"):
            out[name] = body.get(name)
    out = {k: v for k, v in out.items() if v is not None}
    user = body.get("user") or body.get("safety_identifier")  # OpenAI's newer name for it
    if user:
        out["metadata"] = {"user_id": str(user)}
    tools = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
    if tools:
        out["tools"] = [
            {
                "name": f["name"],
                **({"description": f["description"]} if f.get("description") else {}),
                "input_schema": f.get("parameters") or {"type": "object", "properties": {}},
            }
            for f in tools
        ]
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        out["tool_choice"] = choice
    if answers_in_json(body):
        out["tools"] = [_answer_tool(wanted)]
        out["tool_choice"] = {"type": "tool", "name": ANSWER_TOOL}
    if body.get("stream"):
        out["stream"] = True
    return out


def usage(raw: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage → OpenAI's: its input_tokens leave out the tokens read from the cache and
    those written to it, which OpenAI's prompt_tokens count (the written ones under
    `cache_write_tokens`, as the Responses API's usage names them)."""
    cached = raw.get("cache_read_input_tokens") or 0
    written = raw.get("cache_creation_input_tokens") or 0
    prompt = (raw.get("input_tokens") or 0) + cached + written
    completion = raw.get("output_tokens") or 0
    details = {"cached_tokens": cached} | ({"cache_write_tokens": written} if written else {})
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    }


def tool_call(index: int, block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic tool_use block → an OpenAI tool call (`index`: its place in a stream)."""
    return {
        "index": index,
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})},
    }


def chat_reply(message: dict[str, Any], model: str, json_answer: bool = False) -> dict[str, Any]:
    """An Anthropic Message → an OpenAI chat.completion. `json_answer`: the request asked for a
    JSON answer, which the answer tool's input is (the text before it, the model's preamble, is
    not the answer)."""
    blocks = message.get("content") or []
    text = "".join(b["text"] for b in blocks if b.get("type") == "text")
    uses = [b for b in blocks if b.get("type") == "tool_use"]
    thought = [b for b in blocks if _is_thinking(b)]
    if json_answer:
        answer = [json.dumps(b.get("input") or {}) for b in uses if b["name"] == ANSWER_TOOL]
        text, uses = (answer[0] if answer else text), []
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": text or (None if uses else ""),
        "refusal": None,  # OpenAI's schema requires it
    }
    if thought:  # its thinking, to read and to send back with a tool call's results
        reply["reasoning_content"] = "".join(b.get("thinking", "") for b in thought)
        reply["thinking_blocks"] = thought
    if uses:
        reply["tool_calls"] = [tool_call(i, b) for i, b in enumerate(uses)]
        for call in reply["tool_calls"]:
            del call["index"]  # only stream deltas carry an index
    return {
        "id": "chatcmpl-" + message.get("id", ""),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": _finish(message.get("stop_reason"), json_answer),
                # vLLM's field: the stop string that ended it, for Anthropic's clients
                "stop_reason": message.get("stop_sequence"),
            }
        ],
        "usage": usage(message.get("usage") or {}),
    }


def _finish(stop_reason: str | None, json_answer: bool) -> str:
    finish = FINISH.get(stop_reason or "", "stop")
    return "stop" if json_answer and finish == "tool_calls" else finish  # the answer tool's call


def error_reply(status: int, raw: bytes) -> tuple[int, bytes]:
    """An Anthropic error response → (HTTP status, OpenAI error body); also Vertex AI's own
    (`{"error": {"code", "message", "status"}}`) and Bedrock's (`{"message"}`)."""
    try:
        parsed = json.loads(raw)
        error = parsed.get("error") or (
            {"message": parsed["message"]} if "message" in parsed else {}
        )
    except (json.JSONDecodeError, AttributeError, TypeError):
        error = {}
    return _error(error, status)


def _error(error: dict[str, Any], status: int) -> tuple[int, bytes]:
    # Anthropic's error type; Google Cloud's status where Vertex AI itself refused
    kind = error.get("type") or error.get("status") or ""
    fallback = "server_error" if status >= 500 else "invalid_request_error"
    status, openai_type = ERRORS.get(kind, (status, fallback))
    if status == 529:  # Anthropic's "overloaded" has no standard status; OpenAI clients know 503
        status = 503
    message = error.get("message") or "the provider refused the request"
    return status, error_body(message, openai_type, code=kind or None)


class StreamError(StreamRefusal):
    """An `error` event in an Anthropic stream."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(*_error(error, 500))
        self.kind = error.get("type", "api_error")


@dataclass
class ChunkWriter:
    """Anthropic stream events → OpenAI chat.completion.chunk SSE events."""

    model: str
    include_usage: bool
    json_answer: bool = False  # the answer tool's input is the content (see chat_reply)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    tools: dict[int, int] = field(default_factory=dict)  # content block index → tool call index
    answer: int | None = None  # the content block of the answer tool's call
    usage: dict[str, Any] = field(default_factory=dict)
    # the thinking block being streamed: its index, its text and signature so far
    thinking: tuple[int, list[str], list[str]] | None = None
    finish: str = "stop"
    stop_sequence: str | None = None  # the stop string that ended the message

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = self.stop_sequence
        return sse.data(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
            }
        )

    def write(self, kind: str, data: dict[str, Any]) -> bytes:
        """The OpenAI events for one Anthropic event (b"" for none)."""
        if kind == "message_start":
            message = data.get("message") or {}
            self.id = "chatcmpl-" + message.get("id", "")
            self.usage.update(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if self.json_answer and block.get("type") == "tool_use":
                self.answer = data["index"] if block.get("name") == ANSWER_TOOL else self.answer
                return b""
            if block.get("type") == "tool_use":
                index = self.tools[data["index"]] = len(self.tools)
                call = tool_call(index, {**block, "input": None})
                call["function"]["arguments"] = ""
                return self._chunk({"tool_calls": [call]})
            if block.get("type") == "text" and block.get("text") and not self.json_answer:
                return self._chunk({"content": block["text"]})
            if block.get("type") == "thinking":
                self.thinking = (data["index"], [], [])
            if block.get("type") == "redacted_thinking":
                return self._chunk({"thinking_blocks": [block]})
            return b""
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta" and not self.json_answer:
                return self._chunk({"content": delta.get("text", "")})
            if delta.get("type") == "input_json_delta" and data.get("index") == self.answer:
                return self._chunk({"content": delta.get("partial_json", "")})
            if delta.get("type") == "input_json_delta" and data.get("index") in self.tools:
                arguments = {"arguments": delta.get("partial_json", "")}
                call = {"index": self.tools[data["index"]], "function": arguments}
                return self._chunk({"tool_calls": [call]})
            if self.thinking is not None and delta.get("type") == "thinking_delta":
                self.thinking[1].append(delta.get("thinking", ""))
                return self._chunk({"reasoning_content": delta.get("thinking", "")})
            if self.thinking is not None and delta.get("type") == "signature_delta":
                self.thinking[2].append(delta.get("signature", ""))
            return b""
        if kind == "content_block_stop" and self.thinking is not None:
            if data.get("index") != self.thinking[0]:
                return b""
            _, text, signed = self.thinking
            self.thinking = None
            block = {"type": "thinking", "thinking": "".join(text), "signature": "".join(signed)}
            return self._chunk({"thinking_blocks": [block]})  # whole, to be sent back
        if kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason")
            if stop:
                self.finish = _finish(stop, self.json_answer)
                self.stop_sequence = (data.get("delta") or {}).get("stop_sequence")
            self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            return b""
        if kind == "message_stop":
            out = self._chunk({}, self.finish)
            if self.include_usage:
                out += sse.data(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage(self.usage),
                    }
                )
            return out + sse.DONE
        if kind == "error":
            raise StreamError(data.get("error") or {})
        return b""  # ping, and event types added later


async def chat_chunks(
    events: AsyncIterator[sse.Event], writer: ChunkWriter
) -> AsyncIterator[bytes]:
    async for event in events:
        data = json.loads(event.data) if event.data else {}
        out = writer.write(data.get("type") or event.name, data)
        if out:
            yield out
