"""A fake OpenAI-protocol upstream (engine-protocol routes) for gateway tests and the benchmark.

It is not under test: it answers fast and deterministically. Directives in the prompt text steer it:
`#chunks=N` (default 20, capped by max_tokens), `#delay=S` (seconds between chunks, also when not
streamed), `#fail=K` (drop the connection after K chunks), `#status=C` (refuse with HTTP C), `#stop`
(finish with "stop"; else "length"), `#echo` (the reply repeats the prompt's words, one a chunk).
A chat request with `tools` (tool_choice not "none") whose last message is not a tool result is
answered with one call of the forced tool, else the first, with the arguments {"city": "Paris"}
(streamed in two pieces).
Usage: prompt_tokens = whitespace-separated words of the prompt, completion_tokens = chunks sent;
POST /tokenize counts the same words.
GET /stats tells what it saw (active, cancelled, completed streams; last request's headers);
POST /control {"waiting": N} sets the queue depth /load reports.
A prompt of more words than --max-model-len is refused, as OpenAI refuses one too long for it.

Run: python tests/gateway/fake_upstream.py --port P [--model NAME] [--block-size B]
"""

import argparse
import asyncio
import re
import time
from typing import Any

import msgspec

_DIRECTIVE = re.compile(r"#(chunks|delay|fail|status)=([0-9.]+)")


class Stats:
    def __init__(self) -> None:
        self.active = 0
        self.waiting = 0  # reported on /load; set with POST /control {"waiting": N}
        self.cancelled = 0
        self.completed = 0
        self.requests = 0
        self.last_headers: dict[str, str] = {}
        self.last_body: Any = None
        # per x-tenant: requests, streams in flight now, their maximum, and stream-seconds served
        self.tenants: dict[str, dict[str, float]] = {}

    def tenant(self, name: str) -> dict[str, float]:
        return self.tenants.setdefault(
            name,
            {
                "requests": 0,
                "active": 0,
                "max_active": 0,
                "busy_s": 0.0,
                "cancelled": 0,
                "completed": 0,
            },
        )


def _prompt_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        parts = []
        for m in body["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts += [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(parts)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


ARGUMENTS = ('{"city": ', '"Paris"}')


def _tool_call(body: dict[str, Any], call_id: str) -> dict[str, Any] | None:
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    messages = body.get("messages") or []
    if not tools or choice == "none" or (messages and messages[-1].get("role") == "tool"):
        return None
    forced = isinstance(choice, dict)
    name = choice["function"]["name"] if forced else tools[0]["function"]["name"]
    function = {"name": name, "arguments": "".join(ARGUMENTS)}
    return {"id": call_id, "type": "function", "function": function}


def make_app(model: str, block_size: int, max_model_len: int) -> Any:
    stats = Stats()

    async def send_json(send: Any, status: int, data: Any, headers: list | None = None) -> None:
        body = msgspec.json.encode(data)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def read_body(receive: Any) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/health":
                return await send_json(send, 200, {"status": "ok"})
            if path == "/load":
                load = {
                    "model": model,
                    "block_size": block_size,
                    "total_blocks": 1000,
                    "free_blocks": 1000,
                    "running": stats.active,
                    "waiting": stats.waiting,
                    "tokens_queued": 0,
                    "max_model_len": max_model_len,
                }
                return await send_json(send, 200, load)
            if path == "/stats":
                return await send_json(send, 200, {**stats.__dict__})
            if path == "/v1/models":
                return await send_json(send, 200, {"object": "list", "data": [{"id": model}]})
            return await send_json(send, 404, {"error": {"message": "no route"}})

        body = msgspec.json.decode(await read_body(receive))
        if path == "/control":
            stats.waiting = body["waiting"]
            return await send_json(send, 200, {"waiting": stats.waiting})
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        stats.requests += 1
        stats.tenant(headers.get("x-tenant", ""))["requests"] += 1
        stats.last_headers = headers
        stats.last_body = body
        rid = headers.get("x-request-id", "fake")
        echo = [(b"x-request-id", rid.encode())]
        text = _prompt_text(body)
        directives = {k: float(v) for k, v in _DIRECTIVE.findall(text)}
        # `#echo`: the reply repeats the prompt's words (directives left out), one per chunk
        words = [w for w in text.split() if not w.startswith("#")] if "#echo" in text else []

        def piece(i: int) -> str:
            return words[i % len(words)] + " " if words else "tok "

        if "status" in directives:
            error = {"message": "refused", "type": "invalid_request_error", "param": None}
            return await send_json(send, int(directives["status"]), {"error": error})
        # each prompt of a list runs in its own context
        prompts = body.get("prompt") if isinstance(body.get("prompt"), list) else [text]
        longest = max((len(str(p).split()) for p in prompts), default=0)
        if longest > max_model_len and path.endswith("completions"):
            error = {  # as OpenAI and vLLM word it: each word is a token here
                "message": f"This model's maximum context length is {max_model_len} tokens. "
                f"However, your messages resulted in {longest} tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            return await send_json(send, 400, {"error": error})
        if path == "/tokenize":  # the words its usage would count
            count = len(text.split())
            tokens = {"count": count, "max_model_len": max_model_len, "tokens": [0] * count}
            return await send_json(send, 200, tokens)
        chat = path.endswith("/chat/completions")
        ending = "stop" if "#stop" in text else "length"
        n_chunks = min(int(directives.get("chunks", 20)), int(body.get("max_tokens") or 16))
        usage = {
            "prompt_tokens": len(text.split()),
            "completion_tokens": n_chunks,
            "total_tokens": len(text.split()) + n_chunks,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        timings = {"queue": 0.0, "prefill": 0.0, "ttft": 0.0, "e2e": 0.0, "compute": 0.0}
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            delay = directives.get("delay", 0.0)
            if delay:  # generate "slowly", noticing a client that hangs up meanwhile
                gone = asyncio.create_task(receive())
                done, _ = await asyncio.wait({gone}, timeout=delay * n_chunks)
                if done:
                    stats.cancelled += 1
                    stats.tenant(headers.get("x-tenant", ""))["cancelled"] += 1
                    return
                gone.cancel()
            choice: dict[str, Any] = {"index": 0, "finish_reason": ending}
            call = _tool_call(body, f"call_{rid}") if chat else None
            if call is not None:
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice["finish_reason"] = "tool_calls"
            elif chat:
                content = "".join(piece(i) for i in range(n_chunks))
                choice["message"] = {"role": "assistant", "content": content}
            else:
                choice["text"] = "".join(piece(i) for i in range(n_chunks))
            reply = {
                "id": f"cmpl-{rid}",
                "object": kind,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
                "timings": timings,
            }
            return await send_json(send, 200, reply, echo)

        disconnected = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.create_task(watch())
        tenant = stats.tenant(headers.get("x-tenant", ""))
        stats.active += 1
        tenant["active"] += 1
        tenant["max_active"] = max(tenant["max_active"], tenant["active"])
        began = time.monotonic()
        sse = [(b"content-type", b"text/event-stream"), *echo]
        await send({"type": "http.response.start", "status": 200, "headers": sse})
        try:
            delay = directives.get("delay", 0.0)
            call = _tool_call(body, f"call_{rid}") if chat else None
            if call is not None:  # the call's head, then its arguments in two pieces
                n_chunks = len(ARGUMENTS) + 1
                usage["completion_tokens"] = n_chunks
                head = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
                deltas = [{"role": "assistant", "tool_calls": [head]}] + [
                    {"tool_calls": [{"index": 0, "function": {"arguments": a}}]} for a in ARGUMENTS
                ]
                for i, delta in enumerate(deltas):
                    finish = "tool_calls" if i == len(deltas) - 1 else None
                    chunk = {
                        "id": f"cmpl-{rid}",
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    }
                    event = b"data: " + msgspec.json.encode(chunk) + b"\n\n"
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            for i in range(0 if call is not None else n_chunks):
                if "fail" in directives and i == int(directives["fail"]):
                    raise ConnectionAbortedError("fake upstream fails mid-stream (#fail)")
                if delay:
                    await asyncio.sleep(delay)
                if disconnected.is_set():
                    stats.cancelled += 1
                    tenant["cancelled"] += 1
                    return
                finish = ending if i == n_chunks - 1 else None  # as on the whole reply
                if chat:
                    delta = {"content": piece(i)}
                    choice = {"index": 0, "delta": delta, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": piece(i), "finish_reason": finish}
                chunk = {
                    "id": f"cmpl-{rid}",
                    "object": kind + (".chunk" if chat else ""),
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                event = b"data: " + msgspec.json.encode(chunk) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            tail = b""
            if (body.get("stream_options") or {}).get("include_usage"):
                last = {
                    "id": f"cmpl-{rid}",
                    "object": kind + (".chunk" if chat else ""),
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                    "timings": timings,
                }
                tail = b"data: " + msgspec.json.encode(last) + b"\n\n"
            await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})
            stats.completed += 1
            tenant["completed"] += 1
        finally:
            stats.active -= 1
            tenant["active"] -= 1
            tenant["busy_s"] += time.monotonic() - began
            watcher.cancel()

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="fake")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()
    import uvicorn

    app = make_app(args.model, args.block_size, args.max_model_len)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
