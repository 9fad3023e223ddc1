"""Parse and check a completion request before any quota is touched.

The body is decoded once into a dict (forwarded, minus the gateway's own fields) and checked against
small msgspec structs holding only what the gateway itself needs; every other field is the
upstream's business and is validated there (its 400s are passed through unchanged).

Prompt tokens are estimated, not tokenized: ceil(UTF-8 bytes / 4) plus a few tokens per chat
message for the template. The gateway stays model-agnostic (commercial models too) and spends
microseconds, not a tokenizer call; the estimate only sizes reservations and the early context
check, and the engine's reported usage settles the real numbers (the engine also enforces the exact
context window).
"""

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gateway.errors import GatewayError

TOKENS_PER_MESSAGE = 5  # <|im_start|>role\n … <|im_end|>\n in ChatML-style templates
TOKENS_PER_REPLY = 3  # the assistant turn the template opens
MAX_N = 8
Tier = Literal["interactive", "batch"]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class Message(msgspec.Struct):
    role: str
    content: str | list[dict[str, Any]] | None = None


class _Common(msgspec.Struct):
    model: str
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    # gateway extensions (headers x-tier / x-priority / x-request-id win over these)
    tier: Tier | None = None
    priority: Tier | None = None  # the engine protocol's name for the tier
    request_id: str | None = None


class ChatRequest(_Common):
    messages: list[Message] = msgspec.field(default_factory=list)
    max_completion_tokens: int | None = None


class CompletionRequest(_Common):
    # str, list[str], list[int] or list[list[int]]: msgspec unions hold one array type, so the
    # items are checked in estimate_prompt_tokens
    prompt: str | list[Any] = ""


@dataclass
class Parsed:
    """A checked request: what the gateway needs, and the body to forward."""

    model: str
    body: dict[str, Any]  # forwarded upstream (extension fields removed)
    stream: bool
    include_usage: bool  # the client asked for the usage chunk
    prompt_tokens: int  # estimate
    max_tokens: int | None  # as asked; None: fill in from the caps
    n: int
    tier: Tier | None
    request_id: str | None


_PATH = re.compile(r"at `\$\.([A-Za-z_]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z_]+)`")


def _bad(message: str, param: str | None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def _text_bytes(value: Any) -> int:
    """UTF-8 size of the text in a message content (string or list of parts)."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(part.get("text", "")) for part in value if isinstance(part, dict))
    return 0


def estimate_chat_tokens(messages: list[Message]) -> int:
    size = sum(_text_bytes(m.content) for m in messages)
    return math.ceil(size / 4) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_REPLY


def estimate_prompt_tokens(prompt: str | list[Any], nested: bool = False) -> int:
    """Token-id prompts are counted exactly, text estimated; a batch of prompts counts its largest
    (the gateway reserves per request, not per prompt of a batch)."""
    if isinstance(prompt, str):
        return math.ceil(len(prompt.encode()) / 4)
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return len(prompt)
    if nested or not all(isinstance(p, str | list) for p in prompt):
        raise _bad("prompt must be a string, a list of strings or of token-id lists", "prompt")
    return max(estimate_prompt_tokens(p, nested=True) for p in prompt)


def parse(raw: bytes, kind: Literal["chat", "completion"]) -> Parsed:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise _bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", None)
    struct = ChatRequest if kind == "chat" else CompletionRequest
    try:
        req = msgspec.convert(body, struct)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _PATH.search(text) or _MISSING.search(text)
        raise _bad(text, found.group(1) if found else None) from None

    if isinstance(req, ChatRequest):
        if not req.messages:
            raise _bad("'messages' must be a non-empty array", "messages")
        if "prompt" in body:
            raise _bad("chat completions take 'messages', not 'prompt'", "prompt")
        # OpenAI's newer name wins; the engine takes max_tokens
        max_tokens = req.max_completion_tokens or req.max_tokens
        body.pop("max_completion_tokens", None)
        prompt_tokens = estimate_chat_tokens(req.messages)
    else:
        if "prompt" not in body:
            raise _bad("Object missing required field `prompt`", "prompt")
        # OpenAI's legacy completions default to 16 tokens; forward that explicitly
        max_tokens = req.max_tokens if "max_tokens" in body else 16
        prompt_tokens = estimate_prompt_tokens(req.prompt)
    if max_tokens is not None and max_tokens < 1:
        raise _bad("max_tokens must be at least 1", "max_tokens")
    if not 1 <= req.n <= MAX_N:
        raise _bad(f"n must be between 1 and {MAX_N}", "n")
    for field in ("tier", "priority", "request_id"):
        body.pop(field, None)
    return Parsed(
        model=req.model,
        body=body,
        stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        n=req.n,
        tier=req.tier or req.priority,
        request_id=req.request_id,
    )
