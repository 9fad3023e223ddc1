"""OpenAI request bodies (with vLLM's sampling extras), validation, and response shapes."""

import json
import re
import time
import uuid
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import msgspec

from tokenyard.engine.constraints import Constraint
from tokenyard.engine.outputs import RequestError, RequestOutput, Sampled, SeqStats
from tokenyard.engine.sequence import Priority, SamplingParams
from tokenyard.engine.tool_formats.base import ToolFormat

# a cache salt's length at most (vLLM sets none; a salt names a group of requests, it is no text)
MAX_CACHE_SALT = 256


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class StructuredOutputs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `structured_outputs`: what the output must match, one kind at a time."""

    json: dict | str | None = None  # a JSON schema (or its text)
    regex: str | None = None
    choice: list[str] | None = None  # exactly one of these strings
    grammar: str | None = None  # EBNF (xgrammar's dialect, GBNF's)
    json_object: bool | None = None


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it back


class ToolCall(msgspec.Struct, kw_only=True):
    """A tool call of an earlier assistant turn, sent back in the conversation."""

    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None  # an assistant's call in the deprecated form


class _Common(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters, with vLLM's names and meaning
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    prompt_logprobs: int | None = None  # each prompt token's logprob and the top k there
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older names of the same
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # words never generated (each as it starts a word or not)
    include_stop_str_in_output: bool = False  # the stop string that ended the text stays in it
    truncate_prompt_tokens: int | None = None  # only the prompt's last k tokens are read
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:N", not their text
    # only requests of the same salt share cached prompt blocks (the gateway sets one per team)
    cache_salt: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CACHE_SALT)] | None = None
    # tokenyard: what the gateway also sends as headers (x-tenant, x-priority, x-request-id)
    tenant: str | None = None
    priority: str | None = None
    request_id: str | None = None
    # tokenyard: false opts out of speculative decoding (where the engine speculates); the output
    # is the same either way, only its speed differs
    speculative: bool = True


class Prediction(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's Predicted Outputs: text the completion is expected to repeat, most of it (a file
    being edited); its tokens become draft tokens, verified as any draft is."""

    type: Literal["content"]
    content: str | list[dict]


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    prediction: Prediction | None = None
    # OpenAI's deprecated forms of tools and tool_choice (legacy_functions)
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    # vLLM's: the answer goes on from the last message, the assistant's (what Anthropic calls a
    # prefill), instead of opening a turn of its own
    continue_final_message: bool = False
    # vLLM's: false leaves the assistant's turn unopened (the template's text ends with the last
    # message); None: opened unless continue_final_message
    add_generation_prompt: bool | None = None


class CompletionRequest(_Common, kw_only=True):
    # a string, token ids, or a list of either (msgspec allows one array-like type in a union)
    prompt: str | list[str | int | list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None  # candidates drawn per prompt, the n likeliest returned
    # refused rather than ignored (as the gateway refuses it for this engine, backends/fields.py)
    suffix: str | None = None
    max_tokens: int | None = 16  # OpenAI's default for completions


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """`POST /tokenize` for a text (a chat request's body is tokenized as chat would run it)."""

    model: str
    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    tokens: list[int]


class LoadAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `POST /v1/load_lora_adapter`: serve the PEFT directory at lora_path as lora_name."""

    lora_name: str
    lora_path: str


class UnloadAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str


MAX_N = 16
MAX_STOPS = 16
MAX_BAD_WORDS = 128
MAX_TOP_LOGPROBS = 20
# a predicted output longer than any context would be is a mistake, and tokenizing it costs
MAX_PREDICTION_CHARS = 200_000


def decode_body(body: bytes, kind: type[msgspec.Struct]):
    """JSON → request struct, with errors that name the parameter."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        # "Expected `int`, got `str` - at `$.max_tokens`" / "Object missing required field `model`"
        where = re.search(r"at `\$\.?([^`]*)`", message)
        missing = re.search(r"missing required field `([^`]+)`", message)
        parts = [where.group(1) if where else "", missing.group(1) if missing else ""]
        param = ".".join(p for p in parts if p) or None
        raise RequestError(message, param) from None
    except msgspec.DecodeError as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise RequestError(f"{param}: {message}", param)


def truncated(ids: list[int], keep: int | None) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last `keep` tokens (all of them where None)."""
    return ids if keep is None or len(ids) <= keep else ids[-keep:]


def sampling_params(req: _Common, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    _check(req.n >= 1 and req.n <= MAX_N, "n", f"must be between 1 and {MAX_N}")
    _check(max_tokens is None or max_tokens >= 1, "max_tokens", "must be at least 1")
    _check(0.0 <= req.temperature <= 2.0, "temperature", "must be between 0 and 2")
    _check(0.0 < req.top_p <= 1.0, "top_p", "must be in (0, 1]")
    _check(req.top_k == -1 or req.top_k >= 0, "top_k", "must be -1 (off), 0 (off) or positive")
    _check(0.0 <= req.min_p <= 1.0, "min_p", "must be between 0 and 1")
    _check(-2.0 <= req.presence_penalty <= 2.0, "presence_penalty", "must be between -2 and 2")
    _check(-2.0 <= req.frequency_penalty <= 2.0, "frequency_penalty", "must be between -2 and 2")
    _check(0.0 < req.repetition_penalty <= 2.0, "repetition_penalty", "must be in (0, 2]")
    _check(req.min_tokens >= 0, "min_tokens", "must not be negative")
    _check(
        req.seed is None or -(2**63) <= req.seed < 2**64,
        "seed",
        "must be a 64-bit integer (between -2**63 and 2**64 - 1)",
    )
    _check(
        max_tokens is None or req.min_tokens <= max_tokens,
        "min_tokens",
        "must not exceed max_tokens",
    )
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    _check(len(stops) <= MAX_STOPS, "stop", f"at most {MAX_STOPS} stop sequences")
    _check(all(stops), "stop", "stop sequences must not be empty")
    _check(
        req.allowed_token_ids is None or req.allowed_token_ids,
        "allowed_token_ids",
        "must not be empty",
    )
    bad_words = req.bad_words or []
    _check(len(bad_words) <= MAX_BAD_WORDS, "bad_words", f"at most {MAX_BAD_WORDS} words")
    _check(all(w.strip() for w in bad_words), "bad_words", "words must not be empty")
    _check(
        req.truncate_prompt_tokens is None or req.truncate_prompt_tokens >= 1,
        "truncate_prompt_tokens",
        "must be at least 1",
    )
    bias = req.logit_bias or {}
    _check(all(k.isdigit() for k in bias), "logit_bias", "keys must be token ids")
    _check(
        all(-100 <= v <= 100 for v in bias.values()), "logit_bias", "values must be in [-100, 100]"
    )
    _check(
        logprobs is None or 0 <= logprobs <= MAX_TOP_LOGPROBS,
        "top_logprobs" if isinstance(req, ChatRequest) else "logprobs",
        f"must be between 0 and {MAX_TOP_LOGPROBS}",
    )
    _check(
        req.prompt_logprobs is None or 0 <= req.prompt_logprobs <= MAX_TOP_LOGPROBS,
        "prompt_logprobs",
        f"must be between 0 and {MAX_TOP_LOGPROBS}",
    )
    _check(
        req.prompt_logprobs is None or not req.stream,
        "prompt_logprobs",
        "is not available on streamed responses (as vLLM's)",
    )
    return SamplingParams(
        max_tokens=max_tokens or 0,  # 0: filled in from the context left, once the prompt is known
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k if req.top_k > 0 else -1,
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        stop=stops,
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=req.prompt_logprobs,
        skip_special_tokens=req.skip_special_tokens,
        logit_bias={int(k): v for k, v in bias.items()},
        allowed_token_ids=list(req.allowed_token_ids or []),
        include_stop_str_in_output=req.include_stop_str_in_output,
    )


def chat_params(req: ChatRequest, tool_use: "ToolUse", fmt: ToolFormat) -> SamplingParams:
    _check(bool(req.messages), "messages", "must not be empty")
    _check(req.top_logprobs is None or req.logprobs, "top_logprobs", "needs logprobs set to true")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(req, max_tokens_asked(req), logprobs)
    constraint, asked = _constraint(req, tool_use, fmt), vllm_constraint(req)
    if constraint is not None and asked is not None:
        raise RequestError(
            f"{asked.param}: cannot be combined with response_format or a forced tool call",
            asked.param,
        )
    return replace(params, constraint=constraint or asked)


_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def vllm_constraint(req: "ChatRequest | CompletionRequest") -> Constraint | None:
    """The grammar vLLM's structured-output fields ask for (`structured_outputs`, or the older
    `guided_*`), one of them at most; None when none is set."""
    asked = [
        (f"structured_outputs.{kind}", kind, getattr(req.structured_outputs, kind))
        for kind in _STRUCTURED_KINDS
        if req.structured_outputs is not None
        and getattr(req.structured_outputs, kind) not in (None, False)
    ]
    asked += [
        (f"guided_{kind}", kind, getattr(req, f"guided_{kind}"))
        for kind in _STRUCTURED_KINDS[:4]
        if getattr(req, f"guided_{kind}") is not None
    ]
    if not asked:
        return None
    _check(len(asked) == 1, asked[-1][0], "only one kind of structured output at a time")
    param, kind, value = asked[0]
    if kind == "json_object":
        return Constraint.json_schema({"type": "object"}, param)
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise RequestError(f"{param}: is not a JSON schema", param) from None
        _check(isinstance(value, dict), param, "must be a JSON schema (an object)")
        return Constraint.json_schema(value, param)
    if kind == "choice":
        _check(bool(value) and all(value), param, "must be a list of non-empty strings")
        return Constraint.choice(value, param)
    _check(bool(value), param, "must not be empty")
    return Constraint(kind, value, param)


def max_tokens_asked(req: ChatRequest | CompletionRequest) -> int | None:
    """The output's cap as the body gives it (chat: OpenAI's newer name first); None: not given,
    so it is whatever context the prompt leaves."""
    if isinstance(req, ChatRequest):
        return req.max_completion_tokens or req.max_tokens
    return req.max_tokens


_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass
class ToolUse:
    tools: list[dict]  # offered to the model (none with tool_choice "none")
    forced: list[dict]  # one or more of these must be called (required: all; named: that one)


def legacy_functions(req: ChatRequest) -> ChatRequest:
    """OpenAI's deprecated `functions` / `function_call`, and a conversation in their form
    (assistant `function_call`s, `function` messages), as tools: the same grammar and parser serve
    both, and `legacy_message` / `legacy_delta` put the answer back in their form. One call at a
    time, as that API made them."""
    old_history = any(m.role == "function" or m.function_call for m in req.messages)
    if req.functions is None and req.function_call is None and not old_history:
        return req
    _check(req.tools is None or req.functions is None, "functions", "cannot be sent with tools")
    _check(
        req.tool_choice is None or req.function_call is None,
        "function_call",
        "cannot be sent with tool_choice",
    )
    messages, ids = [], {}  # ids: a function's name → the id given to its latest call
    for i, m in enumerate(req.messages):
        if m.function_call is not None:
            ids[m.function_call.name] = f"call_{i}"
            call = ToolCall(function=m.function_call, id=f"call_{i}")
            m = msgspec.structs.replace(m, function_call=None, tool_calls=[call])
        elif m.role == "function":
            _check(bool(m.name), f"messages[{i}].name", "names the function whose result it is")
            m = msgspec.structs.replace(m, role="tool", name=None, tool_call_id=ids.get(m.name))
        messages.append(m)
    choice = req.function_call
    if isinstance(choice, dict):
        _check(
            isinstance(choice.get("name"), str),
            "function_call",
            "must be 'none', 'auto' or {'name': N}",
        )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    legacy = req.functions is not None
    return msgspec.structs.replace(
        req,
        messages=messages,
        tools=[{"type": "function", "function": f} for f in req.functions] if legacy else req.tools,
        tool_choice=req.tool_choice if choice is None else choice,
        parallel_tool_calls=False if legacy else req.parallel_tool_calls,
        functions=None,
        function_call=None,
    )


def legacy_message(message: dict, reason: str | None) -> tuple[dict, str | None]:
    """A whole answer with tool_calls → the deprecated form: its first call as `function_call`."""
    calls = message.pop("tool_calls", None)
    if not calls:
        return message, reason
    message["function_call"] = calls[0]["function"]
    return message, "function_call" if reason == "tool_calls" else reason


def legacy_delta(delta: dict, reason: str | None) -> tuple[dict, str | None]:
    """A streamed delta with tool_calls → the deprecated form (the first call's pieces)."""
    calls = [c for c in delta.pop("tool_calls", []) if c["index"] == 0]
    if calls:  # {"name", "arguments": ""} first, then {"arguments": more}, as OpenAI streamed
        delta["function_call"] = dict(calls[0]["function"])
    return delta, "function_call" if reason == "tool_calls" else reason


def tool_use(req: ChatRequest) -> ToolUse:
    """The request's tools, checked, and which of them must be called."""
    tools = req.tools or []
    for i, tool in enumerate(tools):
        function = tool.get("function")
        _check(
            tool.get("type") == "function" and isinstance(function, dict),
            f"tools[{i}]",
            "must be {'type': 'function', 'function': {...}}",
        )
        name = function.get("name")
        _check(
            isinstance(name, str) and _FUNCTION_NAME.fullmatch(name) is not None,
            f"tools[{i}].function.name",
            "must be 1 to 64 letters, digits, underscores or dashes",
        )
        _check(
            isinstance(function.get("parameters", {}), dict),
            f"tools[{i}].function.parameters",
            "must be a JSON schema object",
        )
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice == "none":
        return ToolUse([], [])
    _check(bool(tools), "tool_choice", "is only allowed when tools are given")
    if choice == "auto":
        return ToolUse(tools, [])
    if choice == "required":
        return ToolUse(tools, tools)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    named = [t for t in tools if t["function"]["name"] == name]
    _check(
        isinstance(choice, dict) and choice.get("type") == "function" and bool(named),
        "tool_choice",
        "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': N}} "
        "naming one of the tools",
    )
    return ToolUse(tools, named)


def response_schema(response_format: dict | None) -> dict | None:
    """The JSON schema response_format asks the output to match; None for text."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    _check(
        kind == "json_schema", "response_format.type", "must be text, json_object or json_schema"
    )
    spec = response_format.get("json_schema")  # type: ignore[union-attr]
    _check(
        isinstance(spec, dict) and isinstance(spec.get("name"), str),
        "response_format.json_schema",
        "must be an object with a name and a schema",
    )
    schema = spec.get("schema", {"type": "object"})
    _check(isinstance(schema, dict), "response_format.json_schema.schema", "must be an object")
    return schema


def _constraint(req: ChatRequest, use: ToolUse, fmt: ToolFormat) -> Constraint | None:
    """The grammar of a forced tool call, or of response_format (which, with tools offered,
    the model may answer with tool calls instead)."""
    schema = response_schema(req.response_format)
    if use.forced:
        return Constraint.structural_tag(fmt.grammar(use.forced, req.parallel_tool_calls))
    if schema is None:
        return None
    if not use.tools:
        return Constraint.json_schema(schema)
    calls = fmt.grammar(use.tools, req.parallel_tool_calls)
    answer = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}
    either = {
        "type": "structural_tag",
        "format": {"type": "or", "elements": [answer, calls["format"]]},
    }
    return Constraint.structural_tag(either, "response_format")


def completion_params(req: CompletionRequest) -> SamplingParams:
    pool = candidates(req)
    if req.best_of is not None:
        _check(req.n <= pool <= MAX_N, "best_of", f"must be between n and {MAX_N}")
        _check(
            pool == req.n or not req.stream,
            "best_of",
            "cannot be streamed (the best is known last)",
        )
    _check(not req.suffix, "suffix", "is not supported")
    # echo with max_tokens 0 reads the prompt and generates nothing: with logprobs, the prompt's
    # tokens scored (how evaluation harnesses ask a model for a text's likelihood)
    read_only = req.echo and req.max_tokens == 0
    # candidates are ranked by their tokens' logprobs, asked for or not
    logprobs = req.logprobs if req.logprobs is not None or pool == req.n else 0
    params = sampling_params(req, None if read_only else req.max_tokens, logprobs)
    if read_only:
        params = replace(params, max_tokens=0)
    if req.echo and req.logprobs is not None:  # the echoed prompt's top k (vLLM's field's too)
        params = replace(params, prompt_logprobs=max(req.logprobs, req.prompt_logprobs or 0))
    return replace(params, constraint=vllm_constraint(req))


def candidates(req: ChatRequest | CompletionRequest) -> int:
    """Choices generated per prompt: `best_of` (at least n) where a completion sets it, else n."""
    best_of = req.best_of if isinstance(req, CompletionRequest) else None
    return req.n if best_of is None else best_of


def likeliest(choices: list["Choice"], pool: int, n: int) -> list["Choice"]:
    """Of each prompt's `pool` candidates, the n whose tokens have the highest mean logprob (as
    OpenAI's best_of), in that order."""
    kept: list[Choice] = []
    for start in range(0, len(choices), pool):
        ranked = sorted(
            choices[start : start + pool],
            key=lambda c: sum(s.logprob or 0.0 for s in c.sampled) / max(len(c.sampled), 1),
            reverse=True,
        )
        kept += ranked[:n]
    return kept


def completion_prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The prompt field's forms → a list of prompts (text or token ids)."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return [prompt]
    _check(bool(prompt), "prompt", "must not be empty")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[list-item]
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        return list(prompt)  # type: ignore[arg-type]
    raise RequestError("prompt: must be a string, token ids, or a list of either", "prompt")


def message_text(content: str | list[dict] | None, param: str = "messages") -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise RequestError(f"content part type {part.get('type')!r} is not supported", param)
        text = part.get("text", "")
        if not isinstance(text, str):
            raise RequestError("a text content part's text must be a string", param)
        parts.append(text)
    return "".join(parts)


def parse_priority(value: str | None) -> Priority:
    if value is None:
        return Priority.INTERACTIVE
    try:
        return Priority[value.upper()]
    except KeyError:
        raise RequestError("priority must be 'interactive' or 'batch'", "priority") from None


def new_request_id() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------- responses


def usage(stats: list[SeqStats], n: int) -> dict:
    """Usage of one or several prompts (n choices each): each prompt counts once, every choice's
    completion counts."""
    prompts = stats[::n]
    prompt = sum(s.prompt_tokens for s in prompts)
    completion = sum(s.completion_tokens for s in stats)
    counted = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in prompts)},
    }
    if any(s.predicted_tokens for s in stats):
        # OpenAI's reading: the prediction's tokens that made it into the completion, and the
        # rest of it (here: what verification accepted of the drafts, most of them the
        # prediction's; unlike OpenAI, the rejected ones are not charged as completion tokens)
        accepted = [min(s.accepted_prediction_tokens, s.predicted_tokens) for s in stats]
        counted["completion_tokens_details"] = {
            "accepted_prediction_tokens": sum(accepted),
            "rejected_prediction_tokens": sum(
                s.predicted_tokens - a for s, a in zip(stats, accepted, strict=True)
            ),
        }
    return counted


def timings(stats: list[SeqStats]) -> dict:
    gaps = [g for s in stats for g in s.token_gaps]
    return {
        "queue": min(s.queue for s in stats),
        "prefill": max(s.prefill for s in stats),
        "ttft": min(s.ttft for s in stats),
        "e2e": max(s.e2e for s in stats),
        "compute": sum(s.compute for s in stats),
        "itl_mean": sum(gaps) / len(gaps) if gaps else 0.0,
    }


def chat_logprobs(sampled: list[Sampled], token_text) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {
                **entry(s.token_id, s.logprob),
                "top_logprobs": [entry(t, lp) for t, lp in (s.top_logprobs or [])],
            }
            for s in sampled
        ],
        "refusal": None,  # OpenAI's schema requires it (null: the model refused nothing)
    }


def completion_logprobs(sampled: list[Sampled], token_text, offset: int) -> dict:
    tokens = [token_text(s.token_id) for s in sampled]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [s.logprob for s in sampled],
        # null where the token has no logprob (an echoed prompt's first), as OpenAI's
        "top_logprobs": [
            None if s.logprob is None else {token_text(t): lp for t, lp in (s.top_logprobs or [])}
            for s in sampled
        ],
        "text_offset": offsets,
    }


def vllm_prompt_logprobs(
    prompt: list[int], scored: list[Sampled], top: int, token_text
) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the prompt's first token (nothing comes before it), then
    per token {token id: {logprob, rank, decoded_token}} for the token itself and the top `top`."""
    assert len(scored) == len(prompt) - 1

    def entry(token_id: int, logprob: float | None, rank: int | None) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": token_text(token_id)}

    out: list[dict | None] = [None]
    for s in scored:
        here = {str(s.token_id): entry(s.token_id, s.logprob, s.rank)}
        for rank, (token_id, logprob) in enumerate((s.top_logprobs or [])[:top], 1):
            here.setdefault(str(token_id), entry(token_id, logprob, rank))
        out.append(here)
    return out


class Choice:
    """Accumulates one choice's outputs for a non-streamed response."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.sampled: list[Sampled] = []
        self.prompt_logprobs: list[Sampled] | None = None  # where the request scored its prompt
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.stats: SeqStats | None = None

    def add(self, out: RequestOutput) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.text.append(out.text)
        self.sampled += out.logprobs
        if out.finish_reason is not None:
            self.finish_reason, self.stats = out.finish_reason, out.stats
            self.stop_reason = out.stop_reason


def created() -> int:
    return int(time.time())
