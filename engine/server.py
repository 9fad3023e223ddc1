"""The engine's HTTP server: OpenAI routes, /health, /load, /metrics (docs/engine-protocol.md)."""

import asyncio
import logging
from collections.abc import AsyncIterator

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.exceptions import HTTPException
from litestar.response import Stream
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.async_engine import AsyncEngine, EngineStopped
from engine.engine import RequestError, RequestOutput
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
    usage,
)
from engine.sequence import GenerationRequest, SamplingParams

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


def create_app(engine: AsyncEngine) -> Litestar:
    core = engine.engine
    tokenizer = core.tokenizer
    model_name = core.model_name

    def fill_max_tokens(params: SamplingParams, prompt_len: int) -> SamplingParams:
        if params.max_tokens == 0:  # not given: whatever context is left
            params.max_tokens = max(1, core.max_model_len - prompt_len)
        return params

    def generation_request(
        request: Request,
        body_fields,
        prompt_ids: list[int],
        params: SamplingParams,
        suffix: str = "",
    ) -> GenerationRequest:
        headers = request.headers
        gen = GenerationRequest(
            request_id=(headers.get("x-request-id") or body_fields.request_id or new_request_id())
            + suffix,
            prompt_ids=prompt_ids,
            params=fill_max_tokens(params, len(prompt_ids)),
            n=body_fields.n,
            priority=parse_priority(headers.get("x-priority") or body_fields.priority),
            tenant=headers.get("x-tenant") or body_fields.tenant or body_fields.user or "default",
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

    def response_headers(request_id: str) -> dict[str, str]:
        return {"x-request-id": request_id}

    # ------------------------------------------------------------ chat

    @post("/v1/chat/completions", status_code=200)
    async def chat_completions(request: Request) -> Response | Stream:
        req = decode_body(await request.body(), ChatRequest)
        check_model(req.model)
        params = chat_params(req)
        messages = []
        for m in req.messages:
            message = {"role": m.role, "content": message_text(m.content)}
            for key in ("name", "tool_calls", "tool_call_id"):
                if getattr(m, key) is not None:
                    message[key] = getattr(m, key)
            messages.append(message)
        prompt_ids = tokenizer.apply_chat_template(messages, req.tools)
        gen = generation_request(request, req, prompt_ids, params)
        cid = f"chatcmpl-{gen.request_id}"
        with_logprobs = params.logprobs is not None

        def logprobs_of(out_sampled) -> dict | None:
            return chat_logprobs(out_sampled, tokenizer.token_text) if with_logprobs else None

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            async def events() -> AsyncIterator[bytes]:
                base = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created(),
                    "model": model_name,
                }
                yield _sse(
                    {
                        **base,
                        "choices": [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                            for i in range(gen.n)
                        ],
                    }
                )
                stats = []
                async for out in engine.generate(gen):
                    if out.finish_reason == "error":
                        yield _sse(error_body("the engine failed while generating", "server_error"))
                        break
                    if out.stats:
                        stats.append(out.stats)
                    if not out.text and out.finish_reason is None and not with_logprobs:
                        continue  # text held back (a possible stop string): nothing to say yet
                    delta = {"content": out.text} if out.text else {}
                    yield _sse(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": out.choice,
                                    "delta": delta,
                                    "logprobs": logprobs_of(out.logprobs),
                                    "finish_reason": out.finish_reason,
                                }
                            ],
                        }
                    )
                if include_usage and len(stats) == gen.n:
                    yield _sse(
                        {**base, "choices": [], "usage": usage(stats), "timings": timings(stats)}
                    )
                yield b"data: [DONE]\n\n"

            return Stream(
                events(),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **response_headers(gen.request_id)},
            )

        choices = [Choice() for _ in range(gen.n)]

        async def collect() -> None:
            async for out in engine.generate(gen):
                choices[out.choice].add(out)

        await _unless_disconnected(collect(), request)
        _raise_if_failed(choices)
        stats = [c.stats for c in choices]
        return Response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created(),
                "model": model_name,
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": "".join(c.text)},
                        "logprobs": logprobs_of(c.sampled),
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": usage(stats),
                "timings": timings(stats),
            },
            headers=response_headers(gen.request_id),
        )

    # ------------------------------------------------------------ completions

    @post("/v1/completions", status_code=200)
    async def completions(request: Request) -> Response | Stream:
        req = decode_body(await request.body(), CompletionRequest)
        check_model(req.model)
        params = completion_params(req)
        prompts = [
            p if isinstance(p, list) else tokenizer.encode(p) for p in completion_prompts(req)
        ]
        many = len(prompts) > 1
        gens = [
            generation_request(
                request,
                req,
                ids,
                SamplingParams(**vars(params)) if many else params,
                f"-{i}" if many else "",
            )
            for i, ids in enumerate(prompts)
        ]
        request_id = gens[0].request_id.removesuffix("-0")
        cid = f"cmpl-{request_id}"
        n = req.n
        with_logprobs = params.logprobs is not None
        offsets = [0] * (n * len(gens))

        def logprobs_of(index: int, sampled) -> dict | None:
            if not with_logprobs:
                return None
            out = completion_logprobs(sampled, tokenizer.token_text, offsets[index])
            if out["text_offset"]:
                last = out["tokens"][-1]
                offsets[index] = out["text_offset"][-1] + len(last)
            return out

        def stream_outputs():
            return _merged([engine.generate(g) for g in gens])

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            async def events() -> AsyncIterator[bytes]:
                base = {
                    "id": cid,
                    "object": "text_completion",
                    "created": created(),
                    "model": model_name,
                }
                stats = []
                async for p, out in stream_outputs():
                    if out.finish_reason == "error":
                        yield _sse(error_body("the engine failed while generating", "server_error"))
                        break
                    if out.stats:
                        stats.append(out.stats)
                    if not out.text and out.finish_reason is None and not with_logprobs:
                        continue
                    index = p * n + out.choice
                    yield _sse(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": index,
                                    "text": out.text,
                                    "logprobs": logprobs_of(index, out.logprobs),
                                    "finish_reason": out.finish_reason,
                                }
                            ],
                        }
                    )
                if include_usage and len(stats) == n * len(gens):
                    yield _sse(
                        {
                            **base,
                            "choices": [],
                            "usage": _usage_over(stats, n),
                            "timings": timings(stats),
                        }
                    )
                yield b"data: [DONE]\n\n"

            return Stream(
                events(),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, **response_headers(request_id)},
            )

        choices = [Choice() for _ in range(n * len(gens))]

        async def collect() -> None:
            async for p, out in stream_outputs():
                choices[p * n + out.choice].add(out)

        await _unless_disconnected(collect(), request)
        _raise_if_failed(choices)
        stats = [c.stats for c in choices]
        return Response(
            {
                "id": cid,
                "object": "text_completion",
                "created": created(),
                "model": model_name,
                "choices": [
                    {
                        "index": i,
                        "text": "".join(c.text),
                        "logprobs": logprobs_of(i, c.sampled),
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": _usage_over(stats, n),
                "timings": timings(stats),
            },
            headers=response_headers(request_id),
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
    )


def _usage_over(stats: list, n: int) -> dict:
    """Usage of several prompts: each prompt counts once, every choice's completion counts."""
    groups = [stats[i : i + n] for i in range(0, len(stats), n)]
    totals = [usage(g) for g in groups]
    prompt = sum(t["prompt_tokens"] for t in totals)
    completion = sum(t["completion_tokens"] for t in totals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": sum(t["prompt_tokens_details"]["cached_tokens"] for t in totals)
        },
    }


def _raise_if_failed(choices: list[Choice]) -> None:
    if any(c.finish_reason == "error" for c in choices):
        raise RuntimeError("the engine failed while generating")


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
