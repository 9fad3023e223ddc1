"""A fake OpenAI API: POST /v1/chat/completions and /v1/completions, streamed or not, in OpenAI's
wire format (chunks with `usage: null` and a last `choices: []` usage chunk when
stream_options.include_usage, then `data: [DONE]`; tool calls; errors as {"error": {...}}).

Like OpenAI it refuses a request without `Authorization: Bearer …` (401) and one with a field it
does not know (400 "Unrecognized request argument supplied: top_k"). Faults and output follow the
prompt directives and the control endpoint described in fake_common.py.

Run: python tests/backends/fake_openai.py --port P
"""

import asyncio
import sys
import time
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

_COMMON = {"model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "seed"}
_COMMON |= {"presence_penalty", "stop", "stream", "stream_options", "temperature", "top_p", "user"}
KNOWN = {
    "/v1/chat/completions": _COMMON
    | {"messages", "top_logprobs", "max_completion_tokens", "response_format", "tools"}
    | {"tool_choice", "parallel_tool_calls", "metadata", "store", "service_tier"}
    | {"reasoning_effort", "modalities", "prediction", "functions", "function_call"},
    "/v1/completions": _COMMON | {"prompt", "best_of", "echo", "suffix"},
}
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error"}
ERROR_TYPES |= {429: "rate_limit_exceeded"}
ARGUMENTS = '{"city": "Paris"}'


def error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def prompt_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        return " ".join(text_of(m.get("content")) for m in body["messages"])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _usage(body: dict[str, Any], d: Directives) -> dict[str, Any]:
    prompt = len(prompt_text(body).split())
    return {
        "prompt_tokens": prompt,
        "completion_tokens": d.chunks,
        "total_tokens": prompt + d.chunks,
        "prompt_tokens_details": {"cached_tokens": min(d.cached, prompt), "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


async def handle(
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    d: Directives,
    send: Send,
) -> None:
    if path not in KNOWN:
        return await send_json(send, 404, error(404, f"Invalid URL (POST {path})"))
    if not headers.get("authorization", "").startswith("Bearer "):
        return await send_json(send, 401, error(401, "You didn't provide an API key."))
    unknown = sorted(set(body) - KNOWN[path])
    if unknown:
        message = f"Unrecognized request argument supplied: {unknown[0]}"
        return await send_json(send, 400, error(400, message, unknown[0]))
    chat = path == "/v1/chat/completions"
    tool = (body.get("tools") or [{}])[0].get("function", {}).get("name") if d.tool else None
    base = {
        "id": "chatcmpl-fake" if chat else "cmpl-fake",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body.get("model", "") + "-2024-07-18",  # OpenAI answers with a dated snapshot
        "system_fingerprint": "fp_fake",
    }
    pieces = [f"w{i} " for i in range(d.chunks)]
    finish = "tool_calls" if tool else "stop"
    if not body.get("stream"):
        if d.delay:
            await asyncio.sleep(d.delay)
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces)}
            message["refusal"] = None
            if tool:
                message["content"] = None
                call = {"name": tool, "arguments": ARGUMENTS}
                message["tool_calls"] = [{"id": "call_fake", "type": "function", "function": call}]
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {
                "index": 0,
                "text": "".join(pieces),
                "logprobs": None,
                "finish_reason": finish,
            }
        return await send_json(send, 200, {**base, "choices": [choice], "usage": _usage(body, d)})

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any] | str, finish_reason: str | None = None) -> bytes:
        if chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        return _event({**base, "choices": [choice], **extra})

    events: list[bytes] = []
    if chat:
        events.append(chunk({"role": "assistant", "content": "", "refusal": None}))
        if tool:
            call = {"index": 0, "id": "call_fake", "type": "function"}
            call["function"] = {"name": tool, "arguments": ""}
            events.append(chunk({"tool_calls": [call]}))
            for part in ('{"city"', ': "Paris"}'):
                events.append(
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
                )
        else:
            events += [chunk({"content": p}) for p in pieces]
        events.append(chunk({}, finish))
    else:
        events += [chunk(p) for p in pieces]
        events.append(chunk("", finish))
    if include_usage:
        events.append(_event({**base, "choices": [], "usage": _usage(body, d)}))
    events.append(b"data: [DONE]\n\n")
    await start_sse(send)
    for sent, event in enumerate(events):
        await pace(d, sent)
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def make_app() -> Any:
    return make_asgi(handle, error, prompt_text)


if __name__ == "__main__":
    main(make_app, "a fake OpenAI API for tests")
