"""The engine's HTTP server: OpenAI routes, /health, /load, /metrics (docs/engine-protocol.md)."""

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.openapi import json_body, openapi_config
from engine.async_engine import AsyncEngine, EngineStopped
from engine.outputs import RequestError, RequestOutput, Sampled, SeqStats
from engine.protocol import (
    ChatRequest,
    Choice,
    CompletionRequest,
    chat_logprobs,
    chat_params,
    completion_logprobs,
    completion_params,
    completion_prompts,
    created,
    decode_body,
    message_text,
    new_request_id,
    parse_priority,
    timings,
    tool_use,
    usage,
)
from engine.sequence import GenerationRequest, SamplingParams
from engine.tool_formats import ToolCalls, for_template, prompt_messages

log = logging.getLogger(__name__)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _sse(payload: dict) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


class _Disconnected(Exception):
    pass


async def _unless_disconnected(work, request: Request) -> None:
    """Run work; if the client goes away first, cancel it (which cancels its sequences)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    raise _Disconnected


async def _merged(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several requests (one per prompt) as they come, tagged with the prompt's index."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                await queue.put((index, out))
        finally:
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, out = await queue.get()
            if out is None:
                remaining -= 1
            else:
                yield index, out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _events(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    base: dict,
    n: int,
    total: int,
    choice_of,
    include_usage: bool,
    opening: list[dict] | None = None,
) -> AsyncIterator[bytes]:
    """SSE chunks of one response; `choice_of(index, output)` shapes a choice."""
    if opening:
        yield _sse({**base, "choices": opening})
    stats: dict[int, SeqStats] = {}
    async for prompt, out in outputs:
        index = prompt * n + out.choice
        if out.finish_reason == "error":
            yield _sse(error_body("the engine failed while generating", "server_error"))
            break
        if out.stats:
            stats[index] = out.stats
        if out.text or out.finish_reason is not None or out.logprobs[0].logprob is not None:
            yield _sse({**base, "choices": [choice_of(index, out)]})
    if include_usage and len(stats) == total:
        ordered = [stats[i] for i in range(total)]
        yield _sse({**base, "choices": [], "usage": usage(ordered, n), "timings": timings(ordered)})
    yield b"data: [DONE]\n\n"


async def _collect(
    outputs: AsyncIterator[tuple[int, RequestOutput]], n: int, total: int, request: Request
) -> list[Choice]:
    choices = [Choice() for _ in range(total)]

    async def run() -> None:
        async for prompt, out in outputs:
            choices[prompt * n + out.choice].add(out)

    await _unless_disconnected(run(), request)
    if any(c.finish_reason == "error" for c in choices):
        raise RuntimeError("the engine failed while generating")
    return choices


def create_app(engine: AsyncEngine) -> Litestar:
    core = engine.engine
    tokenizer = core.tokenizer
    model_name = core.model_name
    tool_format, native_tools = for_template(tokenizer.hf.chat_template)

    def generation_request(
        request: Request, body, prompt_ids: list[int], params: SamplingParams, suffix: str
    ) -> GenerationRequest:
        if params.max_tokens == 0:  # not given: whatever context is left
            params = replace(params, max_tokens=max(1, core.max_model_len - len(prompt_ids)))
        headers = request.headers
        gen = GenerationRequest(
            request_id=(headers.get("x-request-id") or body.request_id or new_request_id())
            + suffix,
            prompt_ids=prompt_ids,
            params=params,
            n=body.n,
            priority=parse_priority(headers.get("x-priority") or body.priority),
            tenant=headers.get("x-tenant") or body.tenant or body.user or "default",
            speculative=body.speculative,
        )
        core.validate(gen)
        return gen

    def check_model(name: str) -> None:
        if name not in (model_name, core.config.model):
            raise HTTPException(
                status_code=404,
                detail=f"The model {name!r} does not exist (this engine serves {model_name!r})",
                extra={"code": "model_not_found", "param": "model"},
            )

    async def respond(
        request: Request,
        body,
        prompts: list[list[int]],
        params: SamplingParams,
        kind: str,
        choice_of,
        final_choice_of,
        opening: list[dict] | None = None,
    ):
        """Run the prompts (n choices each) and answer streamed or not, as the body asks."""
        many = len(prompts) > 1
        gens = [
            generation_request(request, body, ids, params, f"-{i}" if many else "")
            for i, ids in enumerate(prompts)
        ]
        request_id = gens[0].request_id.removesuffix("-0")
        n, total = body.n, body.n * len(gens)
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        base = {"id": f"{prefix}-{request_id}", "created": created(), "model": model_name}
        headers = {"x-request-id": request_id}
        outputs = _merged([engine.generate(g) for g in gens])
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunk = {**base, "object": f"{kind}.chunk" if kind == "chat.completion" else kind}
            events = _events(outputs, chunk, n, total, choice_of, include_usage, opening)
            return Stream(
                events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )

        choices = await _collect(outputs, n, total, request)
        stats = [c.stats for c in choices]
        return Response(
            {
                **base,
                "object": kind,
                "choices": [final_choice_of(i, c) for i, c in enumerate(choices)],
                "usage": usage(stats, n),
                "timings": timings(stats),
            },
            headers=headers,
        )

    @post("/v1/chat/completions", status_code=200, operation_class=json_body(ChatRequest))
    async def chat_completions(request: Request) -> Response | Stream:
        body = decode_body(await request.body(), ChatRequest)
        check_model(body.model)
        tools = tool_use(body)
        params = chat_params(body, tools, tool_format)
        messages = []
        for m in body.messages:
            message = {"role": m.role, "content": message_text(m.content)}
            for key in ("name", "tool_calls", "tool_call_id"):
                if getattr(m, key) is not None:
                    message[key] = getattr(m, key)
            messages.append(message)
        messages = prompt_messages(tool_format, native_tools, messages, tools.tools)
        prompt = tokenizer.apply_chat_template(
            messages, tools.tools if native_tools and tools.tools else None
        )
        with_logprobs = params.logprobs is not None
        calls: dict[int, ToolCalls] = {}  # per streamed choice, when tools are offered

        def logprobs_of(sampled: list[Sampled]) -> dict | None:
            return chat_logprobs(sampled, tokenizer.token_text) if with_logprobs else None

        def chunk_choice(index: int, out: RequestOutput) -> dict:
            delta, reason = {"content": out.text} if out.text else {}, out.finish_reason
            if tools.tools:
                parsed = calls.setdefault(index, ToolCalls(tool_format))
                delta = parsed.delta(out.text, reason is not None)
                reason = parsed.finish_reason(reason)
            return {
                "index": index,
                "delta": delta,
                "logprobs": logprobs_of(out.logprobs),
                "finish_reason": reason,
            }

        def final_choice(index: int, c: Choice) -> dict:
            message = {"role": "assistant", "content": "".join(c.text), "refusal": None}
            reason = c.finish_reason
            if tools.tools:
                parsed = ToolCalls(tool_format)
                parsed.delta("".join(c.text), True)
                message, reason = parsed.message(), parsed.finish_reason(reason)
            return {
                "index": index,
                "message": message,
                "logprobs": logprobs_of(c.sampled),
                "finish_reason": reason,
            }

        opening = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(body.n)
        ]
        return await respond(
            request, body, [prompt], params, "chat.completion", chunk_choice, final_choice, opening
        )

    @post("/v1/completions", status_code=200, operation_class=json_body(CompletionRequest))
    async def completions(request: Request) -> Response | Stream:
        body = decode_body(await request.body(), CompletionRequest)
        check_model(body.model)
        params = completion_params(body)
        prompts = [
            p if isinstance(p, list) else tokenizer.encode(p) for p in completion_prompts(body)
        ]
        with_logprobs = params.logprobs is not None
        offsets = [0] * (body.n * len(prompts))  # text_offset continues across chunks

        def logprobs_of(index: int, sampled: list[Sampled]) -> dict | None:
            if not with_logprobs:
                return None
            out = completion_logprobs(sampled, tokenizer.token_text, offsets[index])
            if out["tokens"]:
                offsets[index] = out["text_offset"][-1] + len(out["tokens"][-1])
            return out

        def chunk_choice(index: int, out: RequestOutput) -> dict:
            return {
                "index": index,
                "text": out.text,
                "logprobs": logprobs_of(index, out.logprobs),
                "finish_reason": out.finish_reason,
            }

        def final_choice(index: int, c: Choice) -> dict:
            return {
                "index": index,
                "text": "".join(c.text),
                "logprobs": logprobs_of(index, c.sampled),
                "finish_reason": c.finish_reason,
            }

        return await respond(
            request, body, prompts, params, "text_completion", chunk_choice, final_choice
        )

    # ------------------------------------------------------------ the rest

    @get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "tokenyard",
                    "max_model_len": core.max_model_len,
                }
            ],
        }

    @get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name}

    @get("/load")
    async def load() -> dict:
        return core.load()

    @get("/metrics", media_type=CONTENT_TYPE_LATEST)
    async def metrics() -> bytes:
        return generate_latest(core.metrics.registry)

    return Litestar(
        route_handlers=[chat_completions, completions, models, health, load, metrics],
        exception_handlers={
            RequestError: _request_error,
            HTTPException: _http_error,
            EngineStopped: _stopped,
            _Disconnected: _disconnected,
            Exception: _internal_error,
        },
        on_shutdown=[engine.stop],
        request_max_body_size=8 * 2**20,
        openapi_config=openapi_config("tokenyard engine", bearer=False),
    )


def _json_error(status: int, body: dict) -> Response:
    return Response(body, status_code=status, media_type=MediaType.JSON)


def _request_error(_: Request, exc: RequestError) -> Response:
    return _json_error(400, error_body(exc.message, "invalid_request_error", exc.param, exc.code))


def _http_error(_: Request, exc: HTTPException) -> Response:
    extra = exc.extra if isinstance(exc.extra, dict) else {}
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return _json_error(
        exc.status_code, error_body(exc.detail, kind, extra.get("param"), extra.get("code"))
    )


def _stopped(_: Request, exc: EngineStopped) -> Response:
    return _json_error(503, error_body(str(exc), "server_error", code="engine_stopping"))


def _disconnected(_: Request, __: _Disconnected) -> Response:
    return _json_error(499, error_body("client closed the request", "invalid_request_error"))


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return _json_error(500, error_body("internal error in the engine server", "server_error"))
