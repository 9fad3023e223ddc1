"""OpenAI chat ⇄ Google's Gemini API (generateContent): requests, replies, stream events, errors.

Pure functions and one stream writer, no I/O: backends/gemini.py sends what these build. The
gateway's Gemini front (gateway/gemini/translate.py) reads the same tables the other way, so the
two directions cannot drift apart. Requests carry JSON Schema as it is (`parametersJsonSchema`,
`responseJsonSchema`), not Gemini's older OpenAPI subset.
"""

import base64
import json
import mimetypes
import secrets
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from tokenyard.backends import sse
from tokenyard.backends.anthropic_wire import asked_thinking
from tokenyard.backends.base import StreamRefusal, UpstreamBroken, error_body
from tokenyard.core.errors import GatewayError

Cloud = Literal["", "vertex"]  # "": Google AI Studio (generativelanguage.googleapis.com)

# Gemini finishReason → OpenAI finish_reason (the first of each is what the gateway's Gemini
# front answers for it); a reply with function calls that stopped is "tool_calls"
FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
# HTTP status → google.rpc code name, as Google's APIs name each error
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# HTTP status → OpenAI error type (others: server_error from 500, else invalid_request_error)
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
# OpenAI's reasoning_effort → a thinking budget in tokens, as Google's own OpenAI-compatible
# endpoint maps them (0: no thinking)
THINKING = {"none": 0, "minimal": 1024, "low": 1024, "medium": 8192, "high": 24576}
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
# a tool call id is Gemini's own, or one made here (Gemini's public API gives none), and carries
# the call's thought signature, which Gemini 3 requires back with the call in later turns: an
# OpenAI client returns the id untouched, so the signature goes with it
MADE = "call_g"
SIGNED = "~sig~"
# what a call from elsewhere (another model before a fallback, a client's own history) carries in
# its place: the value Google documents for histories Gemini did not write
UNSIGNED = "skip_thought_signature_validator"
_VERTEX = "/publishers/google/models/"


def _bad(message: str, param: str = "messages") -> GatewayError:
    return GatewayError(400, message, code="unsupported_parameter", param=param)


def path(cloud: Cloud, model: str, verb: str) -> str:
    """Where a generateContent, streamGenerateContent (server-sent events) or countTokens goes,
    below the base URL (AI Studio's …/v1beta; Vertex AI's …/v1/projects/P/locations/R)."""
    where = _VERTEX if cloud == "vertex" else "/models/"
    tail = "?alt=sse" if verb == "streamGenerateContent" else ""
    return f"{where}{quote(model, safe='')}:{verb}{tail}"


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"text": str(part.get("text", ""))}
    if kind == "image_url":
        image = part.get("image_url") or {}
        url = str(image if isinstance(image, str) else image.get("url", ""))
        if url.startswith("data:"):
            head, _, payload = url.partition(",")
            return {"inlineData": {"mimeType": head[5:].split(";")[0], "data": payload}}
        mime = mimetypes.guess_type(url.split("?")[0])[0] or "image/jpeg"
        return {"fileData": {"mimeType": mime, "fileUri": url}}
    raise _bad(f"content part type {kind!r} is not supported")


def _parts(content: Any) -> list[dict[str, Any]]:
    """OpenAI message content (a string or parts) → Gemini parts."""
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"text": content}]
    return [_part(p) for p in content if isinstance(p, dict)]


def _text(content: Any) -> str:
    return "".join(p.get("text", "") for p in _parts(content))


def call_id(given: str | None, signature: str | None) -> str:
    """The OpenAI id of a Gemini function call: its own or a new one, with its signature."""
    made = given or MADE + secrets.token_hex(12)
    return made + SIGNED + signature if signature else made


def _split_id(openai_id: str) -> tuple[str | None, str | None]:
    """(the id to send Gemini, none for one made here; the thought signature, if any)."""
    made, _, signature = openai_id.partition(SIGNED)
    return (None if made.startswith(MADE) else made or None), signature or None


def _name(call: dict[str, Any]) -> str:
    return str((call.get("function") or {}).get("name", ""))


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        args = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError:
        raise _bad("tool call arguments must be JSON") from None
    given, signature = _split_id(str(call.get("id", "")))
    made = {"name": function.get("name", ""), "args": args if isinstance(args, dict) else {}}
    return {
        "functionCall": made | ({"id": given} if given else {}),
        "thoughtSignature": signature or UNSIGNED,
    }


def _function_response(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    openai_id = str(message.get("tool_call_id", ""))
    if openai_id not in names:
        raise _bad(f"tool message {openai_id!r} answers no earlier tool call")
    text = _text(message.get("content"))
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        result = None
    given, _ = _split_id(openai_id)
    answer = {
        "name": names[openai_id],
        # Gemini takes an object: a JSON object as it is, anything else under "result"
        "response": result if isinstance(result, dict) else {"result": text},
    }
    return {"functionResponse": answer | ({"id": given} if given else {})}


def _contents(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """(system instruction, contents): consecutive turns of one role merged, so the responses to
    one turn's function calls arrive together in the next, as Gemini requires."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id → function name: Gemini answers calls by name
    for m in messages:
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
            continue
        if role == "user":
            turn, parts = "user", _parts(m.get("content"))
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            names |= {
                str(c.get("id", "")): (c.get("function") or {}).get("name", "") for c in calls
            }
            turn, parts = "model", _parts(m.get("content")) + [_function_call(c) for c in calls]
        elif role == "tool":
            turn, parts = "user", [_function_response(m, names)]
        else:
            raise _bad(f"message role {role!r} is not supported")
        if not parts:
            continue  # an assistant's empty content beside no calls: nothing to say
        if contents and contents[-1]["role"] == turn:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": turn, "parts": parts})
    return "\n\n".join(s for s in system if s), contents


def _tool_config(choice: Any) -> dict[str, Any]:
    if isinstance(choice, str) and choice in _MODES:
        return {"functionCallingConfig": {"mode": _MODES[choice]}}
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name", "")
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    raise _bad("tool_choice is not one Gemini supports", "tool_choice")


def _generation(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if body.get(ours) is not None:
            config[theirs] = body[ours]
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit:
        config["maxOutputTokens"] = limit
    if stop := body.get("stop"):
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    if (body.get("n") or 1) > 1:
        config["candidateCount"] = body["n"]
    if body.get("logprobs"):
        config["responseLogprobs"] = True
        if body.get("top_logprobs"):
            config["logprobs"] = body["top_logprobs"]
    wanted = body.get("response_format") or {}
    if wanted.get("type") == "json_schema":
        schema = (wanted.get("json_schema") or {}).get("schema") or {}
        config |= {"responseMimeType": "application/json", "responseJsonSchema": schema}
    elif wanted.get("type") == "json_object":
        config["responseMimeType"] = "application/json"
    asked = asked_thinking(body)  # Anthropic's field, as the Messages front sends it
    if asked is not None:
        # adaptive: Gemini's dynamic thinking (-1), the model deciding how much, as Claude does
        budget = {"disabled": 0, "adaptive": -1}.get(asked["type"], asked.get("budget_tokens"))
        config["thinkingConfig"] = {"thinkingBudget": budget}
    elif effort := body.get("reasoning_effort"):
        if effort not in THINKING:
            raise _bad(
                f"reasoning_effort {effort!r} is not one Gemini supports", "reasoning_effort"
            )
        config["thinkingConfig"] = {"thinkingBudget": THINKING[effort]}
    return config


def generate_request(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat.completions body → a generateContent body (the model goes in the path)."""
    if body.get("parallel_tool_calls") is False:
        raise _bad("Gemini cannot be kept to one tool call at a time", "parallel_tool_calls")
    system, contents = _contents(body.get("messages") or [])
    if not contents:
        raise _bad("Gemini needs a user or assistant message, not only a system prompt")
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": [{"text": system}]}
    functions = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
    if functions:
        declared = [
            {"name": f.get("name", "")}
            | ({"description": f["description"]} if f.get("description") else {})
            | ({"parametersJsonSchema": f["parameters"]} if f.get("parameters") else {})
            for f in functions
        ]
        out["tools"] = [{"functionDeclarations": declared}]
        if body.get("tool_choice") is not None:
            out["toolConfig"] = _tool_config(body["tool_choice"])
    if config := _generation(body):
        out["generationConfig"] = config
    return out


def count_request(request: dict[str, Any], cloud: Cloud, model: str) -> dict[str, Any]:
    """What countTokens takes of a generateContent body: AI Studio wraps it whole, Vertex AI takes
    its contents, system instruction and tools as they are."""
    counted = {k: v for k, v in request.items() if k in ("contents", "systemInstruction", "tools")}
    if cloud == "vertex":
        return counted
    return {"generateContentRequest": {"model": f"models/{model}", **counted}}


def usage(raw: dict[str, Any] | None) -> dict[str, Any]:
    """Gemini's usageMetadata → OpenAI's usage: thinking is output (billed as such), cached
    tokens are part of the prompt's count in both."""
    raw = raw or {}
    prompt = (raw.get("promptTokenCount") or 0) + (raw.get("toolUsePromptTokenCount") or 0)
    thoughts = raw.get("thoughtsTokenCount") or 0
    completion = (raw.get("candidatesTokenCount") or 0) + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": raw.get("cachedContentTokenCount") or 0},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


def _logprobs(candidate: dict[str, Any]) -> dict[str, Any] | None:
    result = candidate.get("logprobsResult")
    if not result:
        return None

    def entry(scored: dict[str, Any]) -> dict[str, Any]:
        token = str(scored.get("token", ""))
        return {
            "token": token,
            "logprob": scored.get("logProbability", 0.0),
            "bytes": list(token.encode()),
        }

    tops = result.get("topCandidates") or []
    content = []
    for i, chosen in enumerate(result.get("chosenCandidates") or ()):
        top = (tops[i].get("candidates") or []) if i < len(tops) else []
        content.append(entry(chosen) | {"top_logprobs": [entry(t) for t in top]})
    return {"content": content}


def _said(candidate: dict[str, Any], calls_before: int) -> tuple[str, list[dict[str, Any]]]:
    """A candidate's text (thoughts left out: they are the model's, not the answer) and its
    function calls as OpenAI tool calls, indexed from `calls_before`."""
    text, calls = [], []
    for part in (candidate.get("content") or {}).get("parts") or ():
        if part.get("thought"):
            continue
        if isinstance(part.get("text"), str):
            text.append(part["text"])
        elif call := part.get("functionCall"):
            arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
            calls.append(
                {
                    "index": calls_before + len(calls),
                    "id": call_id(call.get("id"), part.get("thoughtSignature")),
                    "type": "function",
                    "function": {"name": call.get("name", ""), "arguments": arguments},
                }
            )
    return "".join(text), calls


def _finish(reason: str | None, called: bool) -> str:
    finish = FINISH.get(reason or "STOP", "stop")
    return "tool_calls" if called and finish == "stop" else finish


def blocked(reply: dict[str, Any]) -> tuple[int, bytes] | None:
    """A prompt Gemini's own safety checks blocked (200 with no candidates, and why), as the
    refusal OpenAI's clients know: a 400 content_policy_violation."""
    reason = (reply.get("promptFeedback") or {}).get("blockReason")
    if reply.get("candidates") or not reason:
        return None
    message = f"the provider blocked the prompt ({reason})"
    return 400, error_body(message, "invalid_request_error", "content_policy_violation", "messages")


def chat_reply(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """A GenerateContentResponse → an OpenAI chat.completion."""
    choices = []
    for i, candidate in enumerate(reply.get("candidates") or ()):
        text, calls = _said(candidate, 0)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text or (None if calls else ""),
            "refusal": None,  # OpenAI's schema requires it
        }
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        choices.append(
            {
                "index": candidate.get("index", i),
                "message": message,
                "logprobs": _logprobs(candidate),
                "finish_reason": _finish(candidate.get("finishReason"), bool(calls)),
            }
        )
    return {
        "id": "chatcmpl-" + str(reply.get("responseId", "")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(reply.get("usageMetadata")),
    }


def _google_error(error: dict[str, Any], status: int) -> tuple[int, bytes]:
    status = int(error.get("code") or status)
    kind = ERROR_TYPES.get(status) or ("server_error" if status >= 500 else "invalid_request_error")
    message = str(error.get("message") or "the provider refused the request")
    return status, error_body(message, kind, code=error.get("status") or STATUS.get(status))


def error_reply(status: int, raw: bytes) -> tuple[int, bytes]:
    """Google's error response (`{"error": {"code", "message", "status"}}`, or a list of one) →
    (HTTP status, OpenAI error body)."""
    try:
        parsed = json.loads(raw)
        parsed = parsed[0] if isinstance(parsed, list) and parsed else parsed
        error = parsed.get("error") or {}
    except (json.JSONDecodeError, AttributeError, TypeError):
        error = {}
    return _google_error(error if isinstance(error, dict) else {}, status)


@dataclass
class ChunkWriter:
    """GenerateContentResponse events → OpenAI chat.completion.chunk events. Gemini sends each
    function call whole, and no end marker: the stream's end closes the reply."""

    model: str
    include_usage: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    opened: set[int] = field(default_factory=set)  # candidates whose role was sent
    calls: dict[int, int] = field(default_factory=dict)  # candidate → its tool calls so far
    finished: set[int] = field(default_factory=set)
    usage: dict[str, Any] = field(default_factory=dict)

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> bytes:
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
        return sse.data(head | {"model": self.model, "choices": choices} | more)

    def write(self, data: dict[str, Any]) -> bytes:
        """The OpenAI events for one Gemini event (b"" for none)."""
        if "error" in data:
            raise StreamRefusal(*_google_error(data["error"] or {}, 500))
        if refused := blocked(data):
            raise StreamRefusal(*refused)
        self.id = self.id or "chatcmpl-" + str(data.get("responseId", ""))
        self.usage = data.get("usageMetadata") or self.usage
        out = b""
        for i, candidate in enumerate(data.get("candidates") or ()):
            index = candidate.get("index", i)
            text, calls = _said(candidate, self.calls.get(index, 0))
            self.calls[index] = self.calls.get(index, 0) + len(calls)
            delta: dict[str, Any] = {}
            if index not in self.opened:
                self.opened.add(index)
                delta["role"] = "assistant"
            if text or "role" in delta:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            if delta:
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
                out += self._chunk([choice])
            if reason := candidate.get("finishReason"):
                self.finished.add(index)
                finish = _finish(reason, bool(self.calls[index]))
                choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
                out += self._chunk([choice])
        return out

    def end(self) -> bytes:
        """After the last event: the usage, if asked, and [DONE]."""
        if not self.finished:
            raise UpstreamBroken(f"{self.model}: the stream ended before any finish reason")
        out = self._chunk([], usage=usage(self.usage)) if self.include_usage else b""
        return out + sse.DONE


async def chat_chunks(
    events: AsyncIterator[sse.Event], writer: ChunkWriter
) -> AsyncIterator[bytes]:
    async for event in events:
        if event.data and (out := writer.write(json.loads(event.data))):
            yield out
    yield writer.end()


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    """An OpenAI embeddings request's texts (Gemini embeds text, not token ids)."""
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise _bad("Gemini embeds text: input must be a string or a list of strings", "input")
    return texts


def embed_request(body: dict[str, Any], cloud: Cloud, model: str) -> tuple[str, dict[str, Any]]:
    """Where an OpenAI embeddings request goes, and its body: AI Studio's batchEmbedContents (one
    request per text), Vertex AI's predict (one instance per text)."""
    texts, size = embedding_inputs(body), body.get("dimensions")
    if cloud == "vertex":
        asked: dict[str, Any] = {"instances": [{"content": t} for t in texts]}
        if size:
            asked["parameters"] = {"outputDimensionality": size}
        return path(cloud, model, "predict"), asked
    one = {"model": f"models/{model}"} | ({"outputDimensionality": size} if size else {})
    requests = [one | {"content": {"parts": [{"text": t}]}} for t in texts]
    return path(cloud, model, "batchEmbedContents"), {"requests": requests}


def embeddings_reply(reply: dict[str, Any], body: dict[str, Any], model: str) -> dict[str, Any]:
    """Gemini's vectors → OpenAI's embeddings list. Vertex AI counts each text's tokens; AI
    Studio does not, so its usage is the gateway's estimate (a token per 4 bytes)."""
    if "predictions" in reply:
        found = [p["embeddings"] for p in reply["predictions"]]
        vectors = [f["values"] for f in found]
        tokens = sum(int((f.get("statistics") or {}).get("token_count") or 0) for f in found)
    else:
        vectors = [e["values"] for e in reply["embeddings"]]
        tokens = sum(-(-len(t.encode()) // 4) for t in embedding_inputs(body))
    as_base64 = body.get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _packed(v) if as_base64 else v,
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _packed(vector: list[float]) -> str:
    """OpenAI's base64 encoding_format: the floats as little-endian float32, base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
