"""Google's Gemini API (generateContent) in front of any model: a request → an OpenAI chat body,
the chat reply → a GenerateContentResponse, refusals → Google's error shape.

Pure functions, no I/O: gateway/gemini/controller.py runs the walk between them. Field names are
read in the JSON form Google's SDKs send (camelCase) and in the snake_case its REST examples use;
replies use camelCase, as Google's API does.
"""

import json
import re
from typing import Any

from tokenyard.backends.gemini_wire import FINISH as GEMINI_FINISH
from tokenyard.backends.gemini_wire import STATUS
from tokenyard.core.errors import GatewayError, refusal_message

# OpenAI finish reason → Gemini's: the first Gemini reason the backend reads as it (a call of a
# function ends "STOP" there)
FINISH = {openai: gemini for gemini, openai in reversed(GEMINI_FINISH.items())} | {
    "tool_calls": "STOP",
    "function_call": "STOP",
}
_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required"}
# generationConfig → chat fields that take the value as it is
_SAMPLING = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "candidateCount": "n",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
# generationConfig fields accepted with no effect here: a thinking budget is the model's own
# business, and the platform's guard policy, not the request, decides what is blocked
_INERT = {"thinkingConfig", "responseModalities", "mediaResolution"}
_CAMEL = re.compile(r"_([a-z])")


def _bad(message: str, param: str = "contents") -> GatewayError:
    return GatewayError(400, message, param=param)


def field(obj: dict[str, Any], name: str) -> Any:
    """`obj[name]` in camelCase, or its snake_case spelling."""
    if name in obj:
        return obj[name]
    return obj.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name))


def _camel(obj: dict[str, Any]) -> dict[str, Any]:
    """Top-level keys in camelCase (the names below are matched in that form)."""
    return {_CAMEL.sub(lambda m: m.group(1).upper(), k): v for k, v in obj.items()}


def as_object(value: Any, where: str) -> dict[str, Any]:
    """`value`, an object, with its top-level names in camelCase; else a 400 naming `where`."""
    if not isinstance(value, dict):
        raise _bad(f"{where} must be an object", where)
    return _camel(value)


def schema(node: Any) -> Any:
    """A Gemini Schema (OpenAPI's subset, types in capitals) → JSON Schema."""
    if isinstance(node, list):
        return [schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = _camel(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = schema(value)
        elif key not in ("nullable", "propertyOrdering"):
            out[key] = value
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _text(content: Any, where: str) -> str:
    """A system instruction: a string, or a Content of text parts."""
    if isinstance(content, str):
        return content
    parts = as_object(content, where).get("parts")
    if not isinstance(parts, list):
        raise _bad(f"{where} must be a string or a Content with parts", where)
    texts = []
    for part in parts:
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise _bad(f"{where} takes text parts only", where)
        texts.append(part["text"])
    return "\n".join(texts)


class _Calls:
    """Function calls' ids across the conversation: a call without one gets one, and a function's
    response without one answers the earliest open call of its name."""

    def __init__(self) -> None:
        self.open: list[tuple[str, str]] = []  # (id, name), unanswered
        self.made = 0

    def call(self, part: dict[str, Any]) -> dict[str, Any]:
        name, args = str(part.get("name", "")), part.get("args") or {}
        self.made += 1
        call_id = str(part.get("id") or f"call_{self.made}")
        self.open.append((call_id, name))
        arguments = json.dumps(args, ensure_ascii=False)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def answer(self, part: dict[str, Any]) -> dict[str, Any]:
        name, given = str(part.get("name", "")), part.get("id")
        match = next((c for c in self.open if (c[0] == given if given else c[1] == name)), None)
        if match is None and not given:
            raise _bad(f"a functionResponse for {name!r} answers no earlier functionCall")
        call_id = match[0] if match else str(given)
        if match is not None:
            self.open.remove(match)
        content = json.dumps(part.get("response") or {}, ensure_ascii=False)
        return {"role": "tool", "tool_call_id": call_id, "content": content}


def _media(part: dict[str, Any], inline: bool) -> dict[str, Any]:
    mime = str(part.get("mimeType") or "")
    if not mime.startswith("image/"):
        raise _bad(f"{mime or 'untyped'} data is not supported: images only")
    url = f"data:{mime};base64,{part.get('data', '')}" if inline else str(part.get("fileUri"))
    return {"type": "image_url", "image_url": {"url": url}}


def _turn(role: str, parts: list[Any], calls: _Calls) -> list[dict[str, Any]]:
    """One Content → OpenAI messages: a model turn's functionCall parts become its tool_calls, a
    user turn's functionResponse parts `tool` messages (before its other parts)."""
    content: list[dict[str, Any]] = []
    made: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    for raw in parts:
        part = as_object(raw, "contents.parts")
        if part.get("thought"):
            continue  # the model's own reasoning, shown to the client: not input
        if isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
        elif "inlineData" in part and role == "user":
            content.append(_media(as_object(part["inlineData"], "inlineData"), inline=True))
        elif "fileData" in part and role == "user":
            content.append(_media(as_object(part["fileData"], "fileData"), inline=False))
        elif "functionCall" in part and role == "assistant":
            made.append(calls.call(as_object(part["functionCall"], "functionCall")))
        elif "functionResponse" in part and role == "user":
            answers.append(calls.answer(as_object(part["functionResponse"], "functionResponse")))
        else:
            kinds = ", ".join(sorted(part)) or "empty"
            raise _bad(f"a {role} part of kind {kinds} is not supported")
    out = list(answers)
    text_only = all(p["type"] == "text" for p in content)
    joined: Any = "".join(p["text"] for p in content) if text_only else content
    if made:
        out.append({"role": "assistant", "content": joined or None, "tool_calls": made})
    elif content or not answers:
        out.append({"role": role, "content": joined})
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    out = []
    for raw in tools:
        tool = as_object(raw, "tools")
        unsupported = sorted(k for k in tool if k != "functionDeclarations")
        if unsupported:
            raise _bad(f"tools of kind {', '.join(unsupported)} are not supported", "tools")
        for raw_decl in tool.get("functionDeclarations") or ():
            decl = as_object(raw_decl, "functionDeclarations")
            parameters = decl.get("parametersJsonSchema")
            if parameters is None:
                parameters = schema(decl.get("parameters") or {"type": "OBJECT", "properties": {}})
            function = {"name": str(decl.get("name", "")), "parameters": parameters}
            if decl.get("description"):
                function["description"] = str(decl["description"])
            out.append({"type": "function", "function": function})
    return out


def _tool_choice(config: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """toolConfig.functionCallingConfig → tool_choice (and the tools, narrowed to the allowed)."""
    calling = as_object(
        field(as_object(config, "toolConfig"), "functionCallingConfig") or {}, "toolConfig"
    )
    mode = str(calling.get("mode") or "AUTO").upper()
    if mode not in _MODES:
        raise _bad(f"function calling mode {mode!r} is not supported", "toolConfig")
    allowed = calling.get("allowedFunctionNames")
    out: dict[str, Any] = {"tool_choice": _MODES[mode]}
    if allowed and mode == "ANY":
        tools = [t for t in tools if t["function"]["name"] in allowed]
        out["tools"] = tools
        if len(tools) == 1:
            out["tool_choice"] = {
                "type": "function",
                "function": {"name": tools[0]["function"]["name"]},
            }
    return out


def _generation(config: Any) -> dict[str, Any]:
    """generationConfig → chat fields."""
    config = as_object(config, "generationConfig")
    out: dict[str, Any] = {}
    for name, value in config.items():
        if name in _SAMPLING:
            out[_SAMPLING[name]] = value
        elif name == "stopSequences":
            out["stop"] = value
        elif name in ("responseLogprobs", "logprobs"):
            if config.get("responseLogprobs"):
                out["logprobs"] = True
                if config.get("logprobs"):
                    out["top_logprobs"] = config["logprobs"]
        elif name in ("responseSchema", "responseJsonSchema", "responseMimeType"):
            continue  # below
        elif name not in _INERT:
            raise _bad(f"generationConfig.{name} is not supported", "generationConfig")
    wanted = config.get("responseJsonSchema") or config.get("responseSchema")
    mime = config.get("responseMimeType") or "text/plain"
    if mime == "application/json" and wanted is not None:
        given = config.get("responseJsonSchema") or schema(wanted)
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": given, "strict": True},
        }
    elif mime == "application/json":
        out["response_format"] = {"type": "json_object"}
    elif mime != "text/plain":
        raise _bad(f"responseMimeType {mime!r} is not supported", "generationConfig")
    return out


def chat_request(raw: Any, model: str, stream: bool) -> dict[str, Any]:
    """A generateContent body for `model` → an OpenAI chat.completions body (checked)."""
    body = as_object(raw, "body")
    turns = body.get("contents")
    if isinstance(turns, dict):
        turns = [turns]
    if not isinstance(turns, list) or not turns:
        raise _bad("contents must be a non-empty list of Content")
    unsupported = sorted(
        set(body)
        - {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig"}
        - {"safetySettings", "model", "labels"}
    )
    if unsupported:
        raise _bad(f"{', '.join(unsupported)} is not supported", unsupported[0])
    messages: list[dict[str, Any]] = []
    if body.get("systemInstruction"):
        messages.append(
            {"role": "system", "content": _text(body["systemInstruction"], "systemInstruction")}
        )
    calls = _Calls()
    for raw_turn in turns:
        turn = as_object(raw_turn, "contents")
        role = {"user": "user", "model": "assistant", "function": "user", None: "user"}.get(
            turn.get("role")
        )
        if role is None:
            raise _bad("each Content's role must be 'user' or 'model'")
        parts = turn.get("parts")
        if not isinstance(parts, list) or not parts:
            raise _bad("each Content must have parts")
        messages += _turn(role, parts, calls)
    out: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:  # the last chunk's usageMetadata: the chat stream must end with the usage
        out["stream_options"] = {"include_usage": True}
    if body.get("generationConfig") is not None:
        out |= _generation(body["generationConfig"])
    if body.get("labels"):  # Vertex AI's request labels: the team's own, as OpenAI's metadata
        out["metadata"] = body["labels"]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
        if body.get("toolConfig"):
            out |= _tool_choice(body["toolConfig"], out["tools"])
    return out


def _embedded_text(request: dict[str, Any]) -> str:
    parts = as_object(request.get("content"), "content").get("parts")
    if not isinstance(parts, list) or not parts:
        raise _bad("content must have parts", "content")
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    if not all(isinstance(t, str) for t in texts) or len(texts) != len(parts):
        raise _bad("only text parts can be embedded", "content")
    return " ".join(texts)  # type: ignore[arg-type]


def embeddings_request(raw: Any, model: str, batch: bool) -> dict[str, Any]:
    """embedContent (one `content`) or batchEmbedContents (`requests`, each one) → an OpenAI
    embeddings body. `taskType` and `title` only tune Google's own models: accepted, no effect."""
    body = as_object(raw, "body")
    if batch:
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise _bad("requests must be a non-empty list", "requests")
        asks = [as_object(r, "requests") for r in requests]
    else:
        asks = [body]
    sizes = {ask.get("outputDimensionality") for ask in asks}
    if len(sizes) > 1:
        raise _bad("every request must ask the same outputDimensionality", "requests")
    out: dict[str, Any] = {"model": model, "input": [_embedded_text(a) for a in asks]}
    if (size := sizes.pop()) is not None:
        out["dimensions"] = size
    return out


def embeddings_reply(reply: dict[str, Any], batch: bool) -> dict[str, Any]:
    """OpenAI's embeddings list → Gemini's `embeddings` (batch) or `embedding` (one)."""
    vectors = [{"values": d["embedding"]} for d in sorted(reply["data"], key=lambda d: d["index"])]
    return {"embeddings": vectors} if batch else {"embedding": vectors[0]}


def usage_metadata(usage: dict[str, Any] | None) -> dict[str, int]:
    usage = usage or {}
    prompt, output = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    out = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": output,
        "totalTokenCount": prompt + output,
    }
    if cached := (usage.get("prompt_tokens_details") or {}).get("cached_tokens"):
        out["cachedContentTokenCount"] = cached
    return out


def function_call(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call → a functionCall part (arguments that are not a JSON object: empty)."""
    function = call.get("function") or {}
    try:
        args = json.loads(function.get("arguments") or "{}")
    except ValueError:
        args = {}
    args = args if isinstance(args, dict) else {}
    return {"functionCall": {"id": call.get("id"), "name": function.get("name", ""), "args": args}}


def logprobs_result(tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat's logprobs of some tokens (`{token, logprob, top_logprobs}` each) → Gemini's
    `logprobsResult`: the chosen token and the top candidates of each step."""

    def scored(entry: dict[str, Any]) -> dict[str, Any]:
        return {"token": entry.get("token", ""), "logProbability": entry.get("logprob")}

    return {
        "chosenCandidates": [scored(t) for t in tokens],
        "topCandidates": [
            {"candidates": [scored(top) for top in t.get("top_logprobs") or ()]} for t in tokens
        ],
    }


def candidate(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    if message.get("content"):
        parts.append({"text": message["content"]})
    parts += [function_call(call) for call in message.get("tool_calls") or ()]
    out = {
        "content": {"role": "model", "parts": parts},
        "finishReason": FINISH.get(choice.get("finish_reason") or "stop", "OTHER"),
        "index": choice.get("index", 0),
    }
    if tokens := (choice.get("logprobs") or {}).get("content"):  # responseLogprobs asked them
        out["avgLogprobs"] = sum(t.get("logprob") or 0.0 for t in tokens) / len(tokens)
        out["logprobsResult"] = logprobs_result(tokens)
    return out


def gemini_reply(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat.completion → a GenerateContentResponse."""
    return {
        "candidates": [candidate(choice) for choice in reply.get("choices") or ()],
        "usageMetadata": usage_metadata(reply.get("usage")),
        "modelVersion": model,
        "responseId": str(reply.get("id", "")),
    }


def blocked_reply(model: str) -> dict[str, Any]:
    """What Gemini answers for a prompt its safety checks block: no candidates, and why."""
    return {"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": model}


def error_body(status: int, message: str) -> dict[str, Any]:
    name = STATUS.get(status) or ("INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": status, "message": message, "status": name}}


def error_from_openai(status: int, raw: bytes) -> dict[str, Any]:
    """An OpenAI-shaped refusal (the gateway's or an upstream's) → Google's error body."""
    return error_body(status, refusal_message(raw))
