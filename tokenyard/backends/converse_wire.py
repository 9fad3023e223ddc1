"""OpenAI chat ⇄ Amazon Bedrock's Converse API, the one request shape Bedrock takes for every model
it serves (Meta's Llama, Mistral's, Amazon's Nova, Cohere's, DeepSeek's, Anthropic's).

Converse is Anthropic's Messages API in other words (content blocks, tool use and tool results as
blocks, the same stop reasons and usage, a stream of block starts, deltas and stops), so it is
translated through anthropic_wire.py's shapes: a request first becomes a Messages body, then
Converse's; a reply or a stream's events become Anthropic's, which anthropic_wire.py turns into
OpenAI's. One translation to OpenAI's shapes for both, so the two cannot drift apart.
"""

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from tokenyard.backends import anthropic_wire, aws_stream, sse
from tokenyard.backends.anthropic_clouds import BEDROCK_ERRORS
from tokenyard.backends.anthropic_wire import StreamError
from tokenyard.backends.base import UpstreamBroken
from tokenyard.core.errors import GatewayError

# Converse's stop reasons that Anthropic's Messages API lacks, as Anthropic's nearest
STOP = {"guardrail_intervened": "refusal", "content_filtered": "refusal"}
FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}


def _bad(message: str, param: str = "messages") -> GatewayError:
    return GatewayError(400, message, code="unsupported_parameter", param=param)


def _result(text: str) -> list[dict[str, Any]]:
    """A tool's output as Converse takes it: a JSON object as `json`, other text as `text`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return [{"json": value}]
    return [{"text": text or "(no output)"}]  # Converse refuses an empty text block


def _block(block: dict[str, Any]) -> dict[str, Any] | None:
    """An Anthropic content block → Converse's (None: an empty text, which Converse refuses)."""
    kind = block["type"]
    if kind == "text":
        return {"text": block["text"]} if block["text"] else None
    if kind == "thinking":  # signed: messages_request sends no other back
        text = {"text": block["thinking"], "signature": block["signature"]}
        return {"reasoningContent": {"reasoningText": text}}
    if kind == "redacted_thinking":
        return {"reasoningContent": {"redactedContent": block["data"]}}
    if kind == "image":
        source = block["source"]
        if source.get("type") != "base64" or source.get("media_type") not in FORMATS:
            raise _bad("Bedrock takes images as PNG, JPEG, GIF or WebP data URLs only")
        image = {"format": FORMATS[source["media_type"]], "source": {"bytes": source["data"]}}
        return {"image": image}
    if kind == "tool_use":
        use = {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}
        return {"toolUse": use}
    result = {"toolUseId": block["tool_use_id"], "content": _result(block["content"])}
    return {"toolResult": result}


def _tool_config(message: dict[str, Any]) -> dict[str, Any]:
    specs = []
    for tool in message["tools"]:
        spec = {"name": tool["name"], "inputSchema": {"json": tool["input_schema"]}}
        if tool.get("description"):
            spec["description"] = tool["description"]
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    choice = message.get("tool_choice")
    if choice is None:
        return config
    if choice.get("disable_parallel_tool_use"):
        raise _bad("Bedrock cannot be kept to one tool call at a time", "parallel_tool_calls")
    kind = choice["type"]
    if kind == "none":
        raise _bad("Bedrock's Converse cannot be told not to call a tool", "tool_choice")
    config["toolChoice"] = {"tool": {"name": choice["name"]}} if kind == "tool" else {kind: {}}
    return config


def converse_request(body: dict[str, Any], adaptive: bool = False) -> dict[str, Any]:
    """An OpenAI chat.completions body → a Converse body (the model goes in the path)."""
    message = anthropic_wire.messages_request(body, "", adaptive)
    turns = []
    for turn in message["messages"]:
        blocks = [b for b in map(_block, turn["content"]) if b is not None]
        if blocks:
            turns.append({"role": turn["role"], "content": blocks})
    out: dict[str, Any] = {"messages": turns}
    if message.get("system"):
        out["system"] = [{"text": message["system"]}]
    config = {"maxTokens": message["max_tokens"]}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("stop_sequences", "stopSequences"),
    ):
        if ours in message:
            config[theirs] = message[ours]
    out["inferenceConfig"] = config
    # Anthropic's own fields, which Bedrock's Claude models take beside Converse's
    native = {k: message[k] for k in ("thinking", "output_config") if k in message}
    if native:
        out["additionalModelRequestFields"] = native
    if message.get("tools"):
        out["toolConfig"] = _tool_config(message)
    return out


def _usage(raw: dict[str, Any] | None) -> dict[str, Any]:
    raw = raw or {}
    return {
        "input_tokens": raw.get("inputTokens") or 0,
        "output_tokens": raw.get("outputTokens") or 0,
        "cache_read_input_tokens": raw.get("cacheReadInputTokens") or 0,
        "cache_creation_input_tokens": raw.get("cacheWriteInputTokens") or 0,
    }


def _stop(reason: str | None) -> str:
    return STOP.get(reason or "end_turn", reason or "end_turn")


def anthropic_message(reply: dict[str, Any]) -> dict[str, Any]:
    """A Converse reply → the Anthropic Message it amounts to."""
    content: list[dict[str, Any]] = []
    for block in ((reply.get("output") or {}).get("message") or {}).get("content") or ():
        if "text" in block:
            content.append({"type": "text", "text": block["text"]})
        elif reasoning := block.get("reasoningContent"):
            content.append(_thought(reasoning))
        elif use := block.get("toolUse"):
            tool = {"id": use["toolUseId"], "name": use["name"], "input": use.get("input") or {}}
            content.append({"type": "tool_use", **tool})
    return {
        "id": secrets.token_hex(12),  # Converse names no message
        "content": content,
        "stop_reason": _stop(reply.get("stopReason")),
        "usage": _usage(reply.get("usage")),
    }


def _thought(reasoning: dict[str, Any]) -> dict[str, Any]:
    """A reasoningContent block → Anthropic's thinking block (unsigned where the model, not
    Claude, signs none) or redacted_thinking block."""
    if "redactedContent" in reasoning:
        return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    text = reasoning.get("reasoningText") or {}
    return {
        "type": "thinking",
        "thinking": text.get("text", ""),
        "signature": text.get("signature", ""),
    }


def _event(kind: str, **data: Any) -> sse.Event:
    return sse.Event(kind, json.dumps({"type": kind, **data}).encode())


def _reasoning(delta: dict[str, Any], index: int, opened: set[int]) -> list[sse.Event]:
    """A reasoningContent delta → Anthropic's thinking events: Converse opens the block with its
    first delta, Anthropic with a content_block_start (the redacted kind carries its data)."""
    if "redactedContent" in delta:
        opened.add(index)
        block = {"type": "redacted_thinking", "data": delta["redactedContent"]}
        return [_event("content_block_start", index=index, content_block=block)]
    events = []
    if index not in opened:
        opened.add(index)
        block = {"type": "thinking", "thinking": "", "signature": ""}
        events.append(_event("content_block_start", index=index, content_block=block))
    for key, kind, name in (
        ("text", "thinking", "thinking"),
        ("signature", "signature", "signature"),
    ):
        if key in delta:
            part = {"type": f"{kind}_delta", name: delta[key]}
            events.append(_event("content_block_delta", index=index, delta=part))
    return events


def _as_anthropic(frame: aws_stream.Frame, opened: set[int]) -> list[sse.Event]:
    """One frame's Anthropic events; `opened`: the reasoning blocks begun so far, whose stop
    closes them (a text block's stop, as Anthropic's writer needs none, is dropped)."""
    event, index = frame.payload, frame.payload.get("contentBlockIndex", 0)
    if frame.name == "messageStart":
        message = {"id": secrets.token_hex(12), "usage": {}}
        return [_event("message_start", message=message)]
    if frame.name == "contentBlockStart" and (use := (event.get("start") or {}).get("toolUse")):
        block = {"type": "tool_use", "id": use["toolUseId"], "name": use["name"]}
        return [_event("content_block_start", index=index, content_block=block)]
    if frame.name == "contentBlockDelta":
        delta = event.get("delta") or {}
        if "text" in delta:
            text = {"type": "text_delta", "text": delta["text"]}
            return [_event("content_block_delta", index=index, delta=text)]
        if "toolUse" in delta:
            part = {"type": "input_json_delta", "partial_json": delta["toolUse"].get("input", "")}
            return [_event("content_block_delta", index=index, delta=part)]
        if "reasoningContent" in delta:
            return _reasoning(delta["reasoningContent"], index, opened)
    if frame.name == "contentBlockStop" and index in opened:
        return [_event("content_block_stop", index=index)]
    if frame.name == "messageStop":
        stop = {"stop_reason": _stop(event.get("stopReason")), "stop_sequence": None}
        return [_event("message_delta", delta=stop, usage={})]
    if frame.name == "metadata":  # the last event: the usage, then the message is whole
        usage = _usage(event.get("usage"))
        return [_event("message_delta", delta={}, usage=usage), _event("message_stop")]
    return []  # other block stops, events added later


async def events(chunks: AsyncIterator[bytes]) -> AsyncIterator[sse.Event]:
    """A converse-stream's frames → the Anthropic events they amount to; an exception frame is
    the stream's error, as Anthropic's `error` event would be."""
    ended, opened = False, set[int]()
    try:
        async for frame in aws_stream.frames(chunks):
            if frame.kind in ("exception", "error"):
                kind = BEDROCK_ERRORS.get(frame.name, "api_error")
                raise StreamError({"type": kind, "message": frame.message})
            for event in _as_anthropic(frame, opened):
                ended = ended or event.name == "message_stop"
                yield event
    except aws_stream.FrameError as exc:
        raise StreamError({"type": "api_error", "message": str(exc)}) from exc
    if not ended:  # a stream cut before its metadata did not end: it broke
        raise UpstreamBroken("the Converse stream ended before its metadata")
