"""The Responses API onto chat completions: a request's items (with the stored context a
previous_response_id names) become chat messages, its options chat fields; a chat reply becomes a
Response object. Pure functions and data, no I/O: the controller runs them around the gateway's
walk."""

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from tokenyard.core.errors import GatewayError
from tokenyard.core.ids import new_id
from tokenyard.gateway.validation import Metadata

Positive = Annotated[int, msgspec.Meta(ge=1)]


class TextParam(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class PromptRef(msgspec.Struct, kw_only=True):
    """`prompt`: one of the team's reusable prompts (gateway/responses/prompts.py)."""

    id: str
    version: str | int | None = None  # None: the latest
    variables: dict[str, Any] | None = None


class CreateResponse(msgspec.Struct, kw_only=True):
    """What the gateway reads of POST /v1/responses. Unknown fields are accepted (clients send
    `client_metadata`, `prompt_cache_retention`, ...): they ask for nothing here."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    max_output_tokens: Positive | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    include: list[str] | None = None  # "message.output_text.logprobs" asks for the logprobs
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: Metadata | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None  # its id, or {"id": …}
    prompt: PromptRef | None = None
    # the gateway's extensions, as on chat completions
    tier: str | None = None
    priority: str | None = None
    request_id: str | None = None


LOGPROBS = "message.output_text.logprobs"  # the `include` value that asks for them

# chat field → the Responses field a refusal names
PARAMS = {
    "messages": "input",
    "response_format": "text.format",
    "verbosity": "text.verbosity",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
    "logprobs": "top_logprobs",
}


def _bad(message: str, param: str, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def _unsupported(param: str, what: str) -> GatewayError:
    return _bad(f"{what} is not supported by this gateway", param, "unsupported_parameter")


def _parts(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    """A message item's content as Responses content parts."""
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part["annotations"] = []
        return [part]
    if not isinstance(content, list) or not all(isinstance(p, dict) for p in content):
        raise _bad("a message's content must be a string or a list of content parts", where)
    return content


def normalized(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as stored and listed (input_items): each with an id, messages with parts."""
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    out = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise _bad(
                    "a message's role must be user, system, developer or assistant",
                    where + ".role",
                )
            content = _parts(item.get("content"), role, where + ".content")
            out.append(
                {
                    "id": item.get("id") or new_id("msg"),
                    "type": "message",
                    "role": role,
                    "content": content,
                    "status": item.get("status") or "completed",
                }
            )
        elif kind in ("function_call", "function_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"a {kind} item needs its call_id", where + ".call_id")
            prefix = "fc" if kind == "function_call" else "fco"
            out.append({**item, "id": item.get("id") or new_id(prefix), "status": "completed"})
        elif kind == "reasoning":
            continue  # another provider's encrypted reasoning: nothing a model here can read
        else:
            raise _unsupported(where + ".type", f"input items of type {kind!r}")
    return out


def _chat_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "refusal"):
        text = part.get("text", part.get("refusal", ""))
        if not isinstance(text, str):
            raise _bad("a text part's text must be a string", where)
        return {"type": "text", "text": text}
    if kind == "input_image":
        if not part.get("image_url"):
            raise _unsupported(where, "an image by file_id")
        image = {"url": part["image_url"], "detail": part.get("detail") or "auto"}
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":  # passed to OpenAI's models; the field table refuses it elsewhere
        file = {k: part[k] for k in ("file_data", "file_id", "filename") if k in part}
        return {"type": "file", "file": file}
    raise _unsupported(where, f"content parts of type {kind!r}")


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts if isinstance(p.get("text"), str))


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized items → chat messages; function calls join the assistant turn before them."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if item["type"] == "message":
            parts = [_chat_part(p, f"{where}.content") for p in item["content"]]
            if item["role"] != "user" or all(p["type"] == "text" for p in parts):
                messages.append({"role": item["role"], "content": _text(parts)})
            else:
                messages.append({"role": "user", "content": parts})
        elif item["type"] == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last.get("content") or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(_parts(output, "tool", where))
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return messages


def _chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise _unsupported(f"tools[{i}].type", f"tools of type {tool.get('type')!r}")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        if not isinstance(function.get("name"), str):
            raise _bad("a function tool needs its name", f"tools[{i}].name")
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _bad("tool_choice must be auto, none, required or a function", "tool_choice")
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _unsupported("tool_choice", f"tool_choice of type {choice.get('type')!r}")


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        keys = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}
    raise _bad("text.format.type must be text, json_schema or json_object", "text.format")


# what OpenAI's models get of a request, as the client sent it: OpenAI's own fields, less what the
# gateway does itself (store, previous_response_id: it keeps conversations) or refuses
NATIVE = frozenset(
    {
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "temperature",
        "top_p",
        "top_logprobs",
        "reasoning",
        "stream",
        "stream_options",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "service_tier",
        "include",
        "max_tool_calls",
        "truncation",  # OpenAI truncates by its own count; the gateway's sizes its reservation
    }
)


@dataclass
class Turn:
    """One response being made: what it echoes, the context it stores, and its request as chat
    (for the walk, and every model but OpenAI's) and as OpenAI takes it (`native`)."""

    id: str
    created_at: int
    echo: dict[str, Any]  # the Response object's fields that repeat the request
    context: list[dict[str, Any]]  # earlier context and this input: what input_items lists
    chat: dict[str, Any]
    native: dict[str, Any]
    store: bool
    model: str = ""  # the model that served it (known once the walk picked it)
    output: list[dict[str, Any]] = field(default_factory=list)
    conversation: str | None = None  # the conversation it reads and adds its items to
    fresh: list[dict[str, Any]] = field(default_factory=list)  # this turn's own input items


def _native(raw: dict[str, Any], context: list[dict[str, Any]]) -> dict[str, Any]:
    """The request for OpenAI's models: the whole conversation as input (its items without the
    gateway's ids), nothing stored there."""
    body = {k: v for k, v in raw.items() if k in NATIVE}
    body["input"] = [{k: v for k, v in i.items() if k not in ("id", "status")} for i in context]
    body["store"] = False
    return body


def conversation_of(req: CreateResponse) -> str | None:
    """The conversation a request names, as its id (or None)."""
    given = req.conversation
    if isinstance(given, dict):
        given = given.get("id")
    if given is not None and not isinstance(given, str):
        raise _bad("conversation must be an id, or an object with its id", "conversation")
    if given is not None and req.previous_response_id is not None:
        raise _bad("conversation and previous_response_id cannot both be given", "conversation")
    return given


@dataclass
class Prompt:
    """A team's reusable prompt as a response reads it: its messages filled in, as input items,
    and what the response echoes (`prompt`: id, version, variables)."""

    items: list[dict[str, Any]]
    echo: dict[str, Any]


def begin(
    req: CreateResponse,
    raw: dict[str, Any],
    earlier: list[dict[str, Any]],
    conversation: str | None = None,
    prompt: Prompt | None = None,
) -> Turn:
    """A response to `req` (`raw`: its body as sent); `earlier`: the stored context and output of
    its previous response, or the items of its conversation; `prompt`: the reusable prompt it
    names, whose messages go first, as instructions do (and, like them, are not stored)."""
    if req.background and not req.store:
        raise _bad("background responses must be stored (store=true)", "store")
    fresh = normalized(req.input)
    context = earlier + fresh
    before = prompt.items if prompt is not None else []
    chat: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req.instructions, before + context),
        "stream": req.stream,
    }
    if req.stream:  # the usage chunk settles the response's usage
        chat["stream_options"] = {"include_usage": True}
    if req.max_output_tokens is not None:
        chat["max_tokens"] = req.max_output_tokens
    if req.truncation == "auto":  # the oldest turns the model cannot hold are dropped
        chat["truncation"] = "auto"
    if req.tools:
        chat["tools"] = _chat_tools(req.tools)
        if req.parallel_tool_calls is not None:
            chat["parallel_tool_calls"] = req.parallel_tool_calls
    if req.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(req.tool_choice)
    if req.text:
        if (fmt := _response_format(req.text.format)) is not None:
            chat["response_format"] = fmt
        if req.text.verbosity is not None:
            chat["verbosity"] = req.text.verbosity
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        chat["reasoning_effort"] = req.reasoning.get("effort") or "medium"
    if req.top_logprobs is not None or LOGPROBS in (req.include or []):
        chat["logprobs"] = True
        if req.top_logprobs:
            chat["top_logprobs"] = req.top_logprobs
    for name in (
        "temperature",
        "top_p",
        "user",
        "safety_identifier",
        "metadata",  # recorded with the usage (the reply echoes the turn's own)
        "prompt_cache_key",
        "service_tier",
        "tier",
        "priority",
        "request_id",
    ):
        if (value := getattr(req, name)) is not None:
            chat[name] = value
    echo = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning,
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": (req.text and req.text.format) or {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        # as OpenAI echoes function tools: strict (its default: true) and parameters filled in
        "tools": [{"strict": True, "parameters": None, **t} for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "background": bool(req.background),
        "conversation": {"id": conversation} if conversation else None,
        "prompt": prompt.echo if prompt is not None else None,
    }
    native = _native(raw, before + context)
    turn = Turn(new_id("resp"), int(time.time()), echo, context, chat, native, req.store, req.model)
    turn.conversation, turn.fresh = conversation, fresh
    return turn


def adopt(turn: Turn, response: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's own Response for this turn, under the gateway's id, with what the gateway keeps
    itself (store, previous_response_id, metadata, conversation, background, prompt)."""
    kept = ("store", "previous_response_id", "metadata", "conversation", "background", "prompt")
    for name in kept:
        response[name] = turn.echo[name]
    response["id"] = turn.id
    turn.output = response.get("output") or []
    return response


def response_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached, written = details.get("cached_tokens") or 0, details.get("cache_write_tokens") or 0
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    turn: Turn,
    status: str,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = None
    if finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        status, incomplete = "incomplete", {"reason": "content_filter"}
    return {
        "id": turn.id,
        "object": "response",
        "created_at": turn.created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": turn.model,
        "output": turn.output,
        "usage": response_usage(usage),
        **turn.echo,
    }


def message_item(
    item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An output message; `logprobs` as chat gives them (`{token, logprob, bytes,
    top_logprobs}` a token), which is the Responses API's shape too."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    content = [part] if status == "completed" else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def from_chat(turn: Turn, reply: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion → the Response object (its output also kept on the turn)."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    turn.model = reply.get("model") or turn.model
    if message.get("content"):
        logprobs = (choice.get("logprobs") or {}).get("content")
        turn.output.append(message_item(new_id("msg"), message["content"], "completed", logprobs))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        turn.output.append(
            call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                function.get("name", ""),
                function.get("arguments", ""),
                "completed",
            )
        )
    return response_object(turn, "completed", choice.get("finish_reason"), reply.get("usage"))
