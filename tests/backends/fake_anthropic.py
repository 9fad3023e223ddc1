"""A fake Anthropic Messages API: POST /v1/messages, streamed or not, in Anthropic's wire format,
and POST /v1/messages/count_tokens.

Streams are `event: NAME` + `data: {"type": NAME, ...}` pairs in the documented order:
message_start, then per content block content_block_start / content_block_delta (text_delta,
input_json_delta) / content_block_stop, a ping, message_delta (stop_reason, usage.output_tokens),
message_stop. Errors are {"type": "error", "error": {"type", "message"}, "request_id"} with the
documented status per type (529 overloaded_error), and `event: error` inside a stream.

Like Anthropic it refuses a request without `x-api-key` (401) or `anthropic-version` (400), without
`max_tokens`, with a role other than user/assistant, with two consecutive turns of one role (the
strictest reading of the API, so a translation that forgets to merge them fails here), or with a
tool_result whose tool_use_id the previous assistant turn did not use.

Extended thinking (`thinking: {"type": "enabled", "budget_tokens": N}`, or `{"type": "adaptive"}`
with `output_config.effort`, which Opus 4.7 and Claude 5 models alone take) as Anthropic checks it:
N at least 1,024 and under max_tokens; no temperature other than 1, no top_k, no forced tool use;
a thinking block sent back must carry the signature this server gave its text, and with thinking
on, a final assistant turn that used a tool must start with its thinking block. The reply then
starts with a thinking block (streamed as thinking_delta and signature_delta events). Faults and
output follow the prompt directives and the control endpoint described in fake_common.py.

Run: python tests/backends/fake_anthropic.py --port P
"""

import base64
import hashlib
import sys
from pathlib import Path
from typing import Any

import msgspec

if not __package__:  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.backends.fake_common import (
    Directives,
    Send,
    main,
    make_asgi,
    pace,
    send_json,
    start_sse,
    text_of,
)

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}
TYPES |= {404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}
TYPES |= {500: "api_error", 529: "overloaded_error"}
INPUT = {"city": "Paris"}
THOUGHT = "The user asks; I weigh it."
# models that think only adaptively, refusing a budget (Claude Opus 4.7, Claude 5), and the efforts
# output_config takes
ADAPTIVE_ONLY = ("claude-opus-4-7", "claude-opus-5", "claude-sonnet-5")
EFFORTS = ("low", "medium", "high", "xhigh", "max")


def signature(thinking: str) -> str:
    """What this server signs a thinking block's text with (Anthropic's is opaque as well)."""
    return base64.b64encode(
        hashlib.sha256(b"fake-anthropic:" + thinking.encode()).digest()
    ).decode()


def error(status: int, message: str) -> dict[str, Any]:
    kind = TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"}


def prompt_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    parts = [text_of(system)] if system else []
    parts += [text_of(m.get("content")) for m in body.get("messages") or []]
    return " ".join(parts)


# what count_tokens takes: it refuses any other field ("Extra inputs are not permitted")
COUNTED = {"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"}


def invalid(body: dict[str, Any], count: bool = False) -> str | None:
    """Why Anthropic would refuse this body (a count_tokens one with `count`), or None."""
    extra = sorted(set(body) - COUNTED)
    if count and extra:
        return f"{extra[0]}: Extra inputs are not permitted"
    if not count and not isinstance(body.get("max_tokens"), int):
        return "max_tokens: Field required"
    if not body.get("model"):
        return "model: Field required"
    previous_role, used_ids = None, set()
    for i, m in enumerate(body.get("messages") or []):
        role = m.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if role == previous_role:
            return "messages: roles must alternate between 'user' and 'assistant'"
        blocks = m["content"] if isinstance(m.get("content"), list) else []
        for block in blocks:
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in used_ids:
                return f"messages.{i}: tool_result without a matching tool_use"
        used_ids = {b.get("id") for b in blocks if b.get("type") == "tool_use"}
        for j, block in enumerate(blocks):
            if block.get("type") == "thinking" and block.get("signature") != signature(
                str(block.get("thinking"))
            ):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
        previous_role = role
    return _thinking_invalid(body) if "thinking" in body else None


def _thinking_invalid(body: dict[str, Any]) -> str | None:
    thinking = body["thinking"] or {}
    effort = (body.get("output_config") or {}).get("effort")
    if effort not in (None, *EFFORTS):
        return f"output_config.effort: Input should be one of {', '.join(EFFORTS)}"
    if thinking.get("type") == "disabled":
        return None
    if thinking.get("type") != "adaptive":
        if any(name in str(body.get("model")) for name in ADAPTIVE_ONLY):
            return (
                "thinking.type.enabled is not supported for this model: use thinking.type.adaptive"
            )
        budget = thinking.get("budget_tokens")
        if thinking.get("type") != "enabled" or not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if isinstance(body.get("max_tokens"), int) and budget >= body["max_tokens"]:
            return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if body.get("temperature") not in (None, 1, 1.0):
        return "`temperature` may only be set to 1 when thinking is enabled"
    if body.get("top_k") is not None:
        return "`top_k` must be unset when thinking is enabled"
    if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    turns = body.get("messages") or []
    last = max((i for i, m in enumerate(turns) if m.get("role") == "assistant"), default=None)
    if last is not None and isinstance(turns[last].get("content"), list):
        blocks = turns[last]["content"]
        starts = blocks[0].get("type") if blocks else None
        if any(b.get("type") == "tool_use" for b in blocks) and starts not in (
            "thinking",
            "redacted_thinking",
        ):
            return (
                f"messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                f"but found `{starts}`. When `thinking` is enabled, a final `assistant` message "
                "must start with a thinking block."
            )
    return None


def _usage(body: dict[str, Any], d: Directives, output: int) -> dict[str, Any]:
    words = len(prompt_text(body).split())
    cached = min(d.cached, words)
    written = min(d.written, words - cached)
    return {
        "input_tokens": words - cached - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": output,
    }


def _event(name: str, payload: dict[str, Any]) -> bytes:
    data = msgspec.json.encode({"type": name, **payload})
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


async def handle(
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    d: Directives,
    send: Send,
) -> None:
    if path not in ("/v1/messages", "/v1/messages/count_tokens"):
        return await send_json(send, 404, error(404, f"Not found: {path}"))
    if not headers.get("x-api-key"):
        return await send_json(send, 401, error(401, "x-api-key header is required"))
    if not headers.get("anthropic-version"):
        return await send_json(send, 400, error(400, "anthropic-version header is required"))
    count = path.endswith("/count_tokens")
    if (why := invalid(body, count)) is not None:
        return await send_json(send, 400, error(400, why))
    if count:  # the words a message's usage would count (without the cache directive's split)
        return await send_json(send, 200, {"input_tokens": len(prompt_text(body).split())})
    tools = body.get("tools") or []
    # a tool_choice of `tool` or `any` makes the model call one, as Anthropic's models must
    choice = body.get("tool_choice") or {}
    forced = choice.get("name") if choice.get("type") == "tool" else None
    if choice.get("type") == "any" and tools:
        forced = tools[0]["name"]
    tool = forced or (tools[0]["name"] if d.tool and tools else None)
    pieces = [f"w{i} " for i in range(d.chunks)]
    stop = "tool_use" if tool else "end_turn"
    thinks = (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    thought = len(THOUGHT.split()) if thinks else 0  # output tokens the thinking took
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if not body.get("stream"):
        content: list[dict[str, Any]] = [{"type": "text", "text": "".join(pieces)}]
        if thinks:
            block = {"type": "thinking", "thinking": THOUGHT, "signature": signature(THOUGHT)}
            content.insert(0, block)
        if tool:
            content.append({"type": "tool_use", "id": "toolu_fake", "name": tool, "input": INPUT})
        reply = {**message, "content": content, "stop_reason": stop}
        return await send_json(send, 200, {**reply, "usage": _usage(body, d, d.chunks + thought)})

    start = {**message, "usage": _usage(body, d, 1)}
    events = [_event("message_start", {"message": start})]
    text = 0  # the text block's index: after the thinking block, where there is one
    if thinks:
        text = 1
        block = {"type": "thinking", "thinking": "", "signature": ""}
        events.append(_event("content_block_start", {"index": 0, "content_block": block}))
        for part in THOUGHT.partition("; "):
            delta = {"type": "thinking_delta", "thinking": part}
            events.append(_event("content_block_delta", {"index": 0, "delta": delta}))
        delta = {"type": "signature_delta", "signature": signature(THOUGHT)}
        events.append(_event("content_block_delta", {"index": 0, "delta": delta}))
        events.append(_event("content_block_stop", {"index": 0}))
    opened = {"index": text, "content_block": {"type": "text", "text": ""}}
    events.append(_event("content_block_start", opened))
    events.append(_event("ping", {}))
    for piece in pieces:
        delta = {"type": "text_delta", "text": piece}
        events.append(_event("content_block_delta", {"index": text, "delta": delta}))
    events.append(_event("content_block_stop", {"index": text}))
    if tool:
        block = {"type": "tool_use", "id": "toolu_fake", "name": tool, "input": {}}
        events.append(_event("content_block_start", {"index": text + 1, "content_block": block}))
        for part in ("", '{"city"', ': "Paris"}'):
            delta = {"type": "input_json_delta", "partial_json": part}
            events.append(_event("content_block_delta", {"index": text + 1, "delta": delta}))
        events.append(_event("content_block_stop", {"index": text + 1}))
    final = {"delta": {"stop_reason": stop, "stop_sequence": None}}
    output = {"output_tokens": d.chunks + thought}
    events.append(_event("message_delta", {**final, "usage": output}))
    events.append(_event("message_stop", {}))
    if d.stream_error is not None:
        failure = {"error": {"type": "overloaded_error", "message": "Overloaded"}}
        events = [*events[: d.stream_error], _event("error", failure)]
    await start_sse(send)
    for sent, event in enumerate(events):
        await pace(d, sent)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def make_app() -> Any:
    return make_asgi(handle, error, prompt_text)


if __name__ == "__main__":
    main(make_app, "a fake Anthropic Messages API for tests")
