"""A fake OpenAI API: POST /v1/chat/completions and /v1/completions, streamed or not, in OpenAI's
wire format (chunks with `usage: null` and a last `choices: []` usage chunk when
stream_options.include_usage, then `data: [DONE]`; tool calls; errors as {"error": {...}}); and
POST /v1/responses, whole or as its typed events (a message, or a function call with #tool), and
its input-token count (POST /v1/responses/input_tokens); POST /v1/images/generations (gpt-image's
shape: base64 images and their usage in tokens); POST /v1/audio/speech (the audio alone, no
usage) and /v1/audio/transcriptions and /translations (a multipart form with a WAV file; every
response format; whisper-1's usage in seconds, the gpt-4o models' in tokens; the gpt-4o models'
transcript streamed as transcript.text.delta events and a transcript.text.done with the usage).

Like OpenAI it refuses a request without `Authorization: Bearer …` (401) and one with a field it
does not know (400 "Unrecognized request argument supplied: top_k"). Faults and output follow the
prompt directives and the control endpoint described in fake_common.py.

Run: python tests/backends/fake_openai.py --port P
"""

import asyncio
import math
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
    send_bytes,
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
    "/v1/responses": {"model", "input", "instructions", "tools", "tool_choice", "text", "include"}
    | {"parallel_tool_calls", "max_output_tokens", "temperature", "top_p", "top_logprobs"}
    | {"reasoning", "stream", "stream_options", "store", "metadata", "user", "safety_identifier"}
    | {"prompt_cache_key", "prompt_cache_retention", "service_tier", "max_tool_calls"}
    | {"previous_response_id", "truncation", "background", "conversation", "prompt"},
    # TokenCountsBody in OpenAI's OpenAPI document
    "/v1/responses/input_tokens": {"model", "input", "previous_response_id", "tools", "text"}
    | {"reasoning", "truncation", "instructions", "personality", "conversation", "tool_choice"}
    | {"parallel_tool_calls"},
    # CreateImageRequest in OpenAI's OpenAPI document
    "/v1/images/generations": {"model", "prompt", "n", "size", "quality", "response_format"}
    | {"style", "user", "background", "moderation", "output_format", "output_compression"}
    | {"partial_images", "stream"},
    # CreateSpeechRequest, CreateTranscriptionRequest and CreateTranslationRequest
    "/v1/audio/speech": {"model", "input", "voice", "instructions", "response_format", "speed"}
    | {"stream_format"},
    "/v1/audio/transcriptions": {"file", "model", "language", "prompt", "response_format"}
    | {"temperature", "include[]", "timestamp_granularities[]", "stream", "chunking_strategy"}
    | {"known_speaker_names[]", "known_speaker_references[]"},
    "/v1/audio/translations": {"file", "model", "prompt", "response_format", "temperature"},
}
# what each speech format's bytes start with, and its content type (OpenAI's)
AUDIO = {
    "mp3": (b"ID3\x04\x00\x00", "audio/mpeg"),
    "opus": (b"OggS", "audio/ogg"),
    "aac": (b"\xff\xf1", "audio/aac"),
    "flac": (b"fLaC", "audio/flac"),
    "wav": (b"RIFF", "audio/wav"),
    "pcm": (b"", "audio/pcm"),
}
AUDIO_FORMATS = "['flac', 'm4a', 'mp3', 'mp4', 'mpeg', 'mpga', 'oga', 'ogg', 'wav', 'webm']"
# a 1x1 PNG: what every generated image is here
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwAD"
    "hgGAWjR9awAAAABJRU5ErkJggg=="
)
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error"}
ERROR_TYPES |= {429: "rate_limit_exceeded"}
ARGUMENTS = '{"city": "Paris"}'


def error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def prompt_text(body: dict[str, Any]) -> str:
    if "input" in body:  # the Responses API: a string, or items
        items = body["input"]
        if isinstance(items, str):
            return items
        texts = [text_of(i.get("content")) + str(i.get("output", "")) for i in items]
        return " ".join(texts)
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


def _images(body: dict[str, Any]) -> dict[str, Any]:
    """gpt-image's answer: each image base64, and its usage in tokens (the prompt's words in;
    an image's tokens out, 272 for a small one, as gpt-image-1 counts a 1024x1024 low-quality
    image)."""
    n = int(body.get("n") or 1)
    prompt = len(str(body.get("prompt", "")).split())
    usage = {"input_tokens": prompt, "output_tokens": 272 * n, "total_tokens": prompt + 272 * n}
    usage["input_tokens_details"] = {"text_tokens": prompt, "image_tokens": 0}
    images = [{"b64_json": PIXEL} for _ in range(n)]
    return {"created": int(time.time()), "data": images, "usage": usage}


async def _speech(body: dict[str, Any], d: Directives, send: Send) -> None:
    """The audio alone, as OpenAI sends it, in pieces as it is made (#delay apart): the format's
    magic bytes, then a byte per character of the input (so a test can tell the input's length
    from the audio's), in #chunks pieces; #cut drops the connection after that many."""
    asked = body.get("response_format", "mp3")
    if asked not in AUDIO:
        return await send_json(send, 400, error(400, f"Invalid response_format {asked!r}"))
    if body.get("stream_format") == "sse":
        return await send_json(send, 400, error(400, "sse is not supported by this fake"))
    magic, content_type = AUDIO[asked]
    audio = b"\x00" * len(str(body.get("input", "")))
    step = max(1, -(-len(audio) // d.chunks))
    pieces = [magic, *(audio[i : i + step] for i in range(0, len(audio), step))]
    start = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    for i, piece in enumerate(pieces):
        if i:
            await pace(d, i)
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _transcribe(path: str, body: dict[str, Any], send: Send) -> None:
    """A transcript of a WAV file in the asked format; its usage as each model family reports
    it: whisper-1 by the audio's seconds (rounded up), the gpt-4o models in tokens (10 audio
    tokens a second, the prompt's words as text tokens)."""
    upload = body.get("file")
    if not isinstance(upload, dict):
        return await send_json(send, 400, error(400, "you must provide a file", "file"))
    seconds = upload["seconds"]
    if seconds is None:
        message = f"Invalid file format. Supported formats: {AUDIO_FORMATS}"
        return await send_json(send, 400, error(400, message, "file"))
    text = f"the fake heard {seconds:.1f} seconds"
    model = str(body.get("model", ""))
    if model.startswith("whisper"):
        usage: dict[str, Any] = {"type": "duration", "seconds": math.ceil(seconds)}
    else:
        audio, words = math.ceil(seconds * 10), len(str(body.get("prompt", "")).split())
        details = {"text_tokens": words, "audio_tokens": audio}
        output = len(text.split())
        usage = {"type": "tokens", "input_tokens": audio + words, "input_token_details": details}
        usage |= {"output_tokens": output, "total_tokens": audio + words + output}
    asked = body.get("response_format", "json")
    if body.get("stream") == "true" and not model.startswith("whisper"):  # whisper-1 ignores it
        await start_sse(send)
        words = text.split(" ")
        for i, word in enumerate(words):
            delta = {"type": "transcript.text.delta", "delta": word + " " * (i < len(words) - 1)}
            await send({"type": "http.response.body", "body": _event(delta), "more_body": True})
        done = {"type": "transcript.text.done", "text": text, "usage": usage}
        return await send({"type": "http.response.body", "body": _event(done)})
    if asked == "json":
        return await send_json(send, 200, {"text": text, "usage": usage})
    if asked == "verbose_json":
        task = "translate" if path.endswith("translations") else "transcribe"
        segment = {"id": 0, "start": 0.0, "end": seconds, "text": text}
        verbose = {"task": task, "language": "english", "duration": seconds, "text": text}
        return await send_json(send, 200, {**verbose, "segments": [segment], "usage": usage})
    end = f"00:00:{seconds:06.3f}"
    rendered = {
        "text": text + "\n",
        "srt": f"1\n00:00:00,000 --> {end.replace('.', ',')}\n{text}\n\n",
        "vtt": f"WEBVTT\n\n00:00:00.000 --> {end}\n{text}\n\n",
    }
    if asked not in rendered:
        return await send_json(send, 400, error(400, f"Invalid response_format {asked!r}"))
    await send_bytes(send, 200, rendered[asked].encode(), "text/plain; charset=utf-8")


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
    if path == "/v1/responses":
        return await _responses(body, d, send)
    if path == "/v1/images/generations":
        return await send_json(send, 200, _images(body))
    if path == "/v1/audio/speech":
        return await _speech(body, d, send)
    if path.startswith("/v1/audio/"):
        return await _transcribe(path, body, send)
    if path == "/v1/responses/input_tokens":  # the words a response's usage would count
        count = {"object": "response.input_tokens", "input_tokens": len(prompt_text(body).split())}
        return await send_json(send, 200, count)
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


async def _responses(body: dict[str, Any], d: Directives, send: Send) -> None:
    """The Responses API: one message of d.chunks pieces (#echo: of the prompt's words), or one
    call of the first tool."""
    tool = (body.get("tools") or [{}])[0].get("name") if d.tool else None
    words = prompt_text(body).split()
    prompt = len(words)
    if d.echo:
        d.chunks = len(words)
    response: dict[str, Any] = {
        "id": "resp_fake",
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model", "") + "-2024-07-18",
        "output": [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": body.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": [{"strict": True, "parameters": None, **t} for t in body.get("tools") or []],
        "top_p": 1.0,
        "usage": None,
        "metadata": {},
    }
    pieces = [f"{w} " for w in words] if d.echo else [f"w{i} " for i in range(d.chunks)]
    if tool:
        item: dict[str, Any] = {"id": "fc_fake", "type": "function_call", "call_id": "call_fake"}
        item |= {"name": tool, "arguments": ARGUMENTS, "status": "completed"}
    else:
        part = {"type": "output_text", "text": "".join(pieces), "annotations": [], "logprobs": []}
        item = {"id": "msg_fake", "type": "message", "role": "assistant", "status": "completed"}
        item["content"] = [part]
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": d.chunks,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + d.chunks,
    }
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    if not body.get("stream"):
        return await send_json(send, 200, done)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
    ]
    if tool:
        events.append({"type": "response.output_item.added", "output_index": 0, "item": item})
        events += [
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_fake",
                "output_index": 0,
                "delta": part,
            }
            for part in ('{"city"', ': "Paris"}')
        ]
    else:
        added = {**item, "status": "in_progress", "content": []}
        events.append({"type": "response.output_item.added", "output_index": 0, "item": added})
        where = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
        empty = {**item["content"][0], "text": ""}
        events.append({"type": "response.content_part.added", **where, "part": empty})
        events += [
            {"type": "response.output_text.delta", **where, "delta": p, "logprobs": []}
            for p in pieces
        ]
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": done})
    await start_sse(send)
    for sent, event in enumerate(events):
        await pace(d, sent)
        payload = {**event, "sequence_number": sent}
        data = b"event: " + event["type"].encode() + b"\n" + _event(payload)
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def make_app() -> Any:
    return make_asgi(handle, error, prompt_text)


if __name__ == "__main__":
    main(make_app, "a fake OpenAI API for tests")
