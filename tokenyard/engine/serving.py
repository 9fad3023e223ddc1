"""OpenAI's completion protocols over the engine: a request's prompts become sequences, their
outputs a streamed or a whole response (the routes that call this are engine/server.py's)."""

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Protocol

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.response import Stream

from tokenyard.core.errors import ErrorBody, ErrorDetail
from tokenyard.engine.async_engine import AsyncEngine
from tokenyard.engine.lora import AdapterError, LoraAdapter
from tokenyard.engine.outputs import RequestError, RequestOutput, Sampled, SeqStats
from tokenyard.engine.protocol import (
    MAX_PREDICTION_CHARS,
    ChatRequest,
    Choice,
    CompletionRequest,
    DetokenizeRequest,
    LoadAdapterRequest,
    TokenizeRequest,
    ToolUse,
    UnloadAdapterRequest,
    candidates,
    chat_logprobs,
    chat_params,
    completion_logprobs,
    completion_params,
    completion_prompts,
    created,
    decode_body,
    legacy_delta,
    legacy_functions,
    legacy_message,
    likeliest,
    max_tokens_asked,
    message_text,
    new_request_id,
    parse_priority,
    timings,
    tool_use,
    truncated,
    usage,
    vllm_prompt_logprobs,
)
from tokenyard.engine.sequence import GenerationRequest, SamplingParams
from tokenyard.engine.tokenizer import Tokenizer
from tokenyard.engine.tool_formats import ToolCalls, ToolFormat, for_template, prompt_messages

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> bytes:
    """OpenAI's error object (`kind` is its `type`)."""
    return msgspec.json.encode(ErrorBody(ErrorDetail(message, kind, param, code)))


class Disconnected(Exception):
    """The client went away before its (non-streamed) response was ready."""


def _sse(payload: dict) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


class Choices(Protocol):
    """How one response's choices are shaped, streamed and whole (chat or text completion)."""

    object: str  # the response's `object`
    chunk_object: str  # a streamed chunk's
    id_prefix: str

    def opening(self, n: int) -> list[dict] | None:
        """The choices of a stream's first chunk, before any token (None: no such chunk)."""
        ...

    def chunk(self, index: int, out: RequestOutput) -> dict: ...

    def final(self, index: int, choice: Choice) -> dict: ...


class ChatChoices:
    """Chat: deltas of the assistant's message; with tools offered, the calls parsed out of the
    text (per streamed choice, as its text arrives)."""

    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(
        self,
        tokenizer: Tokenizer,
        tool_format: ToolFormat,
        tools: bool,
        logprobs: bool,
        legacy: bool = False,
        token_text: Callable[[int], str] | None = None,
    ):
        self.tokenizer, self.tool_format = tokenizer, tool_format
        self.tools, self.logprobs = tools, logprobs
        self.token_text = token_text or tokenizer.token_text  # how logprobs name a token
        self.legacy = legacy  # answer calls as the deprecated `function_call`
        self.calls: dict[int, ToolCalls] = {}

    def _logprobs(self, sampled: list[Sampled]) -> dict | None:
        return chat_logprobs(sampled, self.token_text) if self.logprobs else None

    def opening(self, n: int) -> list[dict] | None:
        delta = {"role": "assistant", "content": ""}
        return [
            {"index": i, "delta": delta, "logprobs": None, "finish_reason": None} for i in range(n)
        ]

    def chunk(self, index: int, out: RequestOutput) -> dict:
        delta, reason = {"content": out.text} if out.text else {}, out.finish_reason
        if self.tools:
            parsed = self.calls.setdefault(index, ToolCalls(self.tool_format))
            delta = parsed.delta(out.text, reason is not None)
            reason = parsed.finish_reason(reason)
            if self.legacy:
                delta, reason = legacy_delta(delta, reason)
        return {
            "index": index,
            "delta": delta,
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": reason,
            **_stop_reason(out.finish_reason, out.stop_reason),
        }

    def final(self, index: int, choice: Choice) -> dict:
        text = "".join(choice.text)
        message = {"role": "assistant", "content": text, "refusal": None}
        reason = choice.finish_reason
        if self.tools:
            parsed = ToolCalls(self.tool_format)
            parsed.delta(text, True)
            message, reason = parsed.message(), parsed.finish_reason(reason)
            if self.legacy:
                message, reason = legacy_message(message, reason)
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(choice.sampled),
            "finish_reason": reason,
            **_stop_reason(choice.finish_reason, choice.stop_reason),
        }


def _stop_reason(finish_reason: str | None, stop_reason: str | int | None) -> dict:
    """vLLM's `stop_reason` on a finished choice: the stop string or stop token id that ended
    it, null for EOS or another reason (what Anthropic's `stop_sequence` is made from)."""
    return {} if finish_reason is None else {"stop_reason": stop_reason}


class TextChoices:
    """Text completion: text and, when asked, logprobs whose offsets run on across chunks. With
    echo, each choice opens with its prompt (text, and tokens with their logprobs)."""

    object = chunk_object = "text_completion"
    id_prefix = "cmpl"

    def __init__(
        self,
        tokenizer: Tokenizer,
        logprobs: int | None,
        n: int,
        prompts: list[tuple[str, list[int]]] | None,
        token_text: Callable[[int], str] | None = None,
    ):
        self.tokenizer, self.n, self.prompts = tokenizer, n, prompts
        self.token_text = token_text or tokenizer.token_text  # how logprobs name a token
        self.logprobs, self.top = logprobs is not None, logprobs or 0
        self.offsets: dict[int, int] = {}  # per choice index: where its next token's text starts
        self.unechoed = set(range(n * len(prompts))) if prompts else set()

    def _echo(self, index: int, scored: list[Sampled] | None) -> tuple[str, list[Sampled]]:
        """The prompt's text and tokens, once per choice (its first chunk); its first token has
        no logprob (nothing comes before it)."""
        if index not in self.unechoed or self.prompts is None:
            return "", []
        self.unechoed.discard(index)
        text, ids = self.prompts[index // self.n]
        if not self.logprobs:
            return text, []
        # the scores may hold more of the top than logprobs asks (vLLM's prompt_logprobs)
        tops = [
            Sampled(s.token_id, s.logprob, (s.top_logprobs or [])[: self.top]) for s in scored or []
        ]
        return text, [Sampled(ids[0]), *tops]

    def _logprobs(self, index: int, sampled: list[Sampled]) -> dict | None:
        if not self.logprobs:
            return None
        out = completion_logprobs(sampled, self.token_text, self.offsets.get(index, 0))
        if out["tokens"]:
            self.offsets[index] = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def opening(self, n: int) -> list[dict] | None:
        return None

    def chunk(self, index: int, out: RequestOutput) -> dict:
        prompt, scored = self._echo(index, out.prompt_logprobs)
        return {
            "index": index,
            "text": prompt + out.text,
            "logprobs": self._logprobs(index, scored + out.logprobs),
            "finish_reason": out.finish_reason,
            **_stop_reason(out.finish_reason, out.stop_reason),
        }

    def final(self, index: int, choice: Choice) -> dict:
        prompt, scored = self._echo(index, choice.prompt_logprobs)
        return {
            "index": index,
            "text": prompt + "".join(choice.text),
            "logprobs": self._logprobs(index, scored + choice.sampled),
            "finish_reason": choice.finish_reason,
            **_stop_reason(choice.finish_reason, choice.stop_reason),
        }


class OpenAIServing:
    """The engine's side of /v1/chat/completions and /v1/completions."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.core = engine.engine
        self.tokenizer = self.core.tokenizer
        self.model_name = self.core.model_name
        self.tool_format, self.native_tools = for_template(self.tokenizer.hf.chat_template)

    def check_model(self, name: str) -> LoraAdapter | None:
        """The LoRA adapter `name` asks for (None: the base model); 404 for a model not served."""
        if name in (self.model_name, self.core.config.model):
            return None
        adapter = self.core.runner.adapters.get(name)
        if adapter is None:
            served = [self.model_name, *self.core.runner.adapters.names()]
            raise HTTPException(
                status_code=404,
                detail=f"The model {name!r} does not exist (this engine serves "
                f"{', '.join(repr(m) for m in served)})",
                extra={"code": "model_not_found", "param": "model"},
            )
        return adapter

    async def chat(self, request: Request, body: ChatRequest) -> Response | Stream:
        adapter = self.check_model(body.model)
        legacy = body.functions is not None
        body = legacy_functions(body)
        tools = tool_use(body)
        params = self._with_bad_words(chat_params(body, tools, self.tool_format), body)
        prompt = truncated(self.chat_prompt(body, tools), body.truncate_prompt_tokens)
        choices = ChatChoices(
            self.tokenizer,
            self.tool_format,
            bool(tools.tools),
            params.logprobs is not None,
            legacy,
            self._token_text(body),
        )
        return await self._respond(request, body, [prompt], params, choices, adapter)

    def chat_prompt(self, body: ChatRequest, tools: ToolUse) -> list[int]:
        """The conversation's token ids as the model reads them: its chat template, with the tools
        where the template writes them (else in the system prompt, as the tool format does)."""
        last = body.messages[-1].role if body.messages else None
        if body.continue_final_message and body.add_generation_prompt:
            raise RequestError(
                "add_generation_prompt and continue_final_message cannot both be true (as vLLM's)",
                "add_generation_prompt",
            )
        if body.continue_final_message and last != "assistant":
            raise RequestError(
                "continue_final_message needs the last message to be the assistant's, for the "
                "answer to go on from",
                "continue_final_message",
            )
        messages = []
        for m in body.messages:
            message = {"role": m.role, "content": message_text(m.content)}
            for key in ("name", "tool_calls", "tool_call_id"):
                if getattr(m, key) is not None:
                    message[key] = msgspec.to_builtins(getattr(m, key))
            messages.append(message)
        messages = prompt_messages(self.tool_format, self.native_tools, messages, tools.tools)
        return self.tokenizer.apply_chat_template(
            messages,
            tools.tools if self.native_tools and tools.tools else None,
            continue_final=body.continue_final_message,
            open_turn=body.add_generation_prompt is not False,
        )

    def _with_bad_words(
        self, params: SamplingParams, body: ChatRequest | CompletionRequest
    ) -> SamplingParams:
        """vLLM's bad_words as token sequences: each word as it is spelled at the start of the
        text and after a space (a word's tokens differ with the space before it)."""
        if not body.bad_words:
            return params
        sequences: list[list[int]] = []
        for word in body.bad_words:
            for spelled in (word.lstrip(), " " + word.lstrip()):
                ids = self.tokenizer.hf.encode(spelled, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return replace(params, bad_words_ids=sequences)

    def _token_text(self, body: ChatRequest | CompletionRequest) -> Callable[[int], str]:
        """How logprobs name a token: its text, or vLLM's "token_id:N"."""
        if body.return_tokens_as_token_ids:
            return lambda token_id: f"token_id:{token_id}"
        return self.tokenizer.token_text

    def models(self) -> list[dict]:
        """/v1/models: the base model, then each adapter with the base as its parent (vLLM's
        cards)."""
        card = {"object": "model", "created": 0, "owned_by": "tokenyard"}
        limit = {"max_model_len": self.core.max_model_len}
        return [
            {"id": self.model_name, **card, **limit},
            *(
                {"id": name, **card, "parent": self.model_name, **limit}
                for name in self.core.runner.adapters.names()
            ),
        ]

    async def load_adapter(self, body: bytes) -> dict:
        self._runtime_lora()
        change = decode_body(body, LoadAdapterRequest)
        try:  # reading and converting the matrices is file I/O and copies: off the event loop
            await asyncio.to_thread(
                self.core.runner.adapters.add, change.lora_name, change.lora_path
            )
        except AdapterError as exc:
            raise RequestError(str(exc), exc.param, "invalid_lora_adapter") from None
        return {"object": "lora_adapter", "id": change.lora_name, "loaded": True}

    def unload_adapter(self, body: bytes) -> dict:
        self._runtime_lora()
        change = decode_body(body, UnloadAdapterRequest)
        try:
            self.core.runner.adapters.remove(change.lora_name)
        except AdapterError as exc:
            raise HTTPException(
                status_code=404,
                detail=str(exc),
                extra={"code": "model_not_found", "param": "lora_name"},
            ) from None
        return {"object": "lora_adapter", "id": change.lora_name, "loaded": False}

    def _runtime_lora(self) -> None:
        if not self.core.config.allow_runtime_lora:
            raise HTTPException(
                status_code=403,
                detail="adapters are loaded at start here (--lora); loading them over HTTP is "
                "off (start the engine with --allow-runtime-lora)",
                extra={"code": "runtime_lora_disabled"},
            )

    def tokenize(self, body: bytes) -> dict:
        """`POST /tokenize` (vLLM's shape): a chat request's prompt, as chat() would run it, or a
        text's tokens; the count is what the request's `prompt_tokens` would be."""
        if "messages" in decode_body(body, dict):
            chat = legacy_functions(decode_body(body, ChatRequest))
            self.check_model(chat.model)
            ids = self.chat_prompt(chat, tool_use(chat))
        else:
            text = decode_body(body, TokenizeRequest)
            self.check_model(text.model)
            ids = self.tokenizer.hf.encode(text.prompt, add_special_tokens=text.add_special_tokens)
        return {"count": len(ids), "max_model_len": self.core.max_model_len, "tokens": ids}

    def detokenize(self, body: bytes) -> dict:
        request = decode_body(body, DetokenizeRequest)
        self.check_model(request.model)
        vocab = self.core.model_config.vocab_size
        if any(not 0 <= t < vocab for t in request.tokens):
            raise RequestError(f"tokens: ids must be in [0, {vocab})", "tokens")
        return {"prompt": self.tokenizer.decode(request.tokens, skip_special_tokens=False)}

    async def completion(self, request: Request, body: CompletionRequest) -> Response | Stream:
        adapter = self.check_model(body.model)
        params = self._with_bad_words(completion_params(body), body)
        given = completion_prompts(body)
        whole = [p if isinstance(p, list) else self.tokenizer.encode(p) for p in given]
        prompts = [truncated(ids, body.truncate_prompt_tokens) for ids in whole]
        echoed = None
        if body.echo:  # a prompt given as token ids (or cut short) is echoed as its tokens' text
            echoed = [
                (
                    p
                    if isinstance(p, str) and len(kept) == len(ids)
                    else self.tokenizer.decode(kept, False),
                    kept,
                )
                for p, ids, kept in zip(given, whole, prompts, strict=True)
            ]
        choices = TextChoices(self.tokenizer, body.logprobs, body.n, echoed, self._token_text(body))
        return await self._respond(request, body, prompts, params, choices, adapter)

    def _generation_request(
        self,
        request: Request,
        body: ChatRequest | CompletionRequest,
        prompt_ids: list[int],
        params: SamplingParams,
        suffix: str,
        adapter: LoraAdapter | None,
    ) -> GenerationRequest:
        if max_tokens_asked(body) is None:  # whatever context is left
            params = replace(params, max_tokens=max(1, self.core.max_model_len - len(prompt_ids)))
        headers = request.headers
        gen = GenerationRequest(
            request_id=(headers.get("x-request-id") or body.request_id or new_request_id())
            + suffix,
            prompt_ids=prompt_ids,
            params=params,
            n=candidates(body),
            priority=parse_priority(headers.get("x-priority") or body.priority),
            tenant=headers.get("x-tenant") or body.tenant or body.user or "default",
            speculative=body.speculative,
            prediction=self._prediction(body),
            adapter=adapter,
            cache_salt=body.cache_salt,
        )
        self.core.validate(gen)
        return gen

    def _prediction(self, body: ChatRequest | CompletionRequest) -> list[int]:
        """The predicted output's tokens, as the output would spell them (no special tokens)."""
        if not isinstance(body, ChatRequest) or body.prediction is None:
            return []
        text = message_text(body.prediction.content, "prediction")
        if len(text) > MAX_PREDICTION_CHARS:
            raise RequestError(
                f"prediction is {len(text)} characters, above {MAX_PREDICTION_CHARS}", "prediction"
            )
        return self.tokenizer.hf.encode(text, add_special_tokens=False)

    async def _respond(
        self,
        request: Request,
        body: ChatRequest | CompletionRequest,
        prompts: list[list[int]],
        params: SamplingParams,
        choices: Choices,
        adapter: LoraAdapter | None,
    ) -> Response | Stream:
        """Run the prompts (n choices each) and answer streamed or not, as the body asks."""
        many = len(prompts) > 1
        gens = [
            self._generation_request(request, body, ids, params, f"-{i}" if many else "", adapter)
            for i, ids in enumerate(prompts)
        ]
        request_id = gens[0].request_id.removesuffix("-0")
        n, pool = body.n, candidates(body)
        total = n * len(gens)
        base = {
            "id": f"{choices.id_prefix}-{request_id}",
            "created": created(),
            "model": self.model_name if adapter is None else adapter.name,
        }
        headers = {"x-request-id": request_id}
        outputs = _merged([self.engine.generate(g) for g in gens])
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            chunk = {**base, "object": choices.chunk_object}
            events = _events(outputs, chunk, n, total, choices, include_usage)
            return Stream(
                events, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
            )

        done = await _collect(outputs, pool, pool * len(gens), request)
        stats = [c.stats for c in done]  # every candidate's tokens count, as OpenAI bills best_of
        if pool > n:
            done = likeliest(done, pool, n)
        response = {
            **base,
            "object": choices.object,
            "choices": [choices.final(i, c) for i, c in enumerate(done)],
            "usage": usage(stats, pool),
            "timings": timings(stats),
        }
        if body.prompt_logprobs is not None:  # vLLM's extension: per choice, chat's at the top
            chat = isinstance(body, ChatRequest)  # one prompt: its scores once
            scored = [
                vllm_prompt_logprobs(
                    prompts[i // n],
                    c.prompt_logprobs or [],
                    body.prompt_logprobs,
                    self._token_text(body),
                )
                for i, c in enumerate(done[:1] if chat else done)
            ]
            if chat:
                response["prompt_logprobs"] = scored[0]
            else:
                for choice, prompt_scores in zip(response["choices"], scored, strict=True):
                    choice["prompt_logprobs"] = prompt_scores
        return Response(response, headers=headers)


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
    choices: Choices,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """SSE chunks of one response."""
    opening = choices.opening(n)
    if opening:
        yield _sse({**base, "choices": opening})
    stats: dict[int, SeqStats] = {}
    async for prompt, out in outputs:
        index = prompt * n + out.choice
        if out.finish_reason == "error":
            failed = error_body("the engine failed while generating", "server_error")
            yield b"data: " + failed + b"\n\n"
            break
        if out.stats:
            stats[index] = out.stats
        if (
            out.text
            or out.finish_reason is not None
            or out.prompt_logprobs is not None
            or out.logprobs[0].logprob is not None
        ):
            yield _sse({**base, "choices": [choices.chunk(index, out)]})
    if include_usage and len(stats) == total:
        ordered = [stats[i] for i in range(total)]
        yield _sse({**base, "choices": [], "usage": usage(ordered, n), "timings": timings(ordered)})
    yield b"data: [DONE]\n\n"


async def _collect(
    outputs: AsyncIterator[tuple[int, RequestOutput]], n: int, total: int, request: Request
) -> list[Choice]:
    """A non-streamed response's choices; if the client goes away first, the work is cancelled
    (which cancels its sequences) and Disconnected raised."""
    choices = [Choice() for _ in range(total)]

    async def run() -> None:
        async for prompt, out in outputs:
            choices[prompt * n + out.choice].add(out)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(run()), asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        raise Disconnected
    watcher.cancel()
    task.result()
    if any(c.finish_reason == "error" for c in choices):
        raise RuntimeError("the engine failed while generating")
    return choices
