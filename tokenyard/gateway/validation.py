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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from tokenyard.backends.base import Upload
from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import Usage

TOKENS_PER_MESSAGE = 5  # <|im_start|>role\n … <|im_end|>\n in ChatML-style templates
TOKENS_PER_REPLY = 3  # the assistant turn the template opens
MAX_N = 8
# choices one request may run: prompts of a legacy-completions list × n; each is a sequence the
# engine schedules, so the request's reservation covers them all, and this bounds its size
MAX_CHOICES = 128
MAX_CLIENT_ID = 128
MAX_END_USER = 128  # characters of an end-user id kept with the usage
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per embeddings request
MAX_RERANK_DOCUMENTS = 1000  # Cohere's limit per rerank request
# a client's own request id (OpenAI's X-Client-Request-Id): printable ASCII without spaces, so it
# can never break a header, a log line or a SQL index
_CLIENT_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_CLIENT_ID}}}")
Tier = Literal["interactive", "batch"]
# OpenAI's bounds on a request's metadata: up to 16 pairs, keys up to 64 characters, values up to
# 512; the gateway records it with the usage, so a team can report its spend by any of its keys
# Text a usage record keeps from the client holds no NUL: PostgreSQL's text refuses it, so such a
# record could never be written and its request would go unbilled
_NO_NUL = r"^[^\x00]*$"
Label = Annotated[str, msgspec.Meta(pattern=_NO_NUL)]
Metadata = Annotated[
    dict[
        Annotated[str, msgspec.Meta(max_length=64, pattern=_NO_NUL)],
        Annotated[str, msgspec.Meta(max_length=512, pattern=_NO_NUL)],
    ],
    msgspec.Meta(max_length=16),
]
_S = TypeVar("_S", bound=msgspec.Struct)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class Message(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[Any] | None = None
    function_call: Any = None


def _check_messages(messages: list[Message]) -> None:
    """OpenAI's rule: only an assistant turn that calls a tool may go without content."""
    for i, m in enumerate(messages):
        if m.content is None and not (m.role == "assistant" and (m.tool_calls or m.function_call)):
            raise _bad(f"messages[{i}] ({m.role}) must have 'content'", "messages")


# bounds in the structs themselves, so the OpenAPI schema (generated from them) says what is checked
Positive = Annotated[int, msgspec.Meta(ge=1)]


class _Common(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: Positive | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] = 1
    # gateway extensions (headers x-tier / x-priority / x-request-id win over these)
    tier: Tier | None = None
    priority: Tier | None = None  # the engine protocol's name for the tier
    request_id: str | None = None
    # the client's own end user (OpenAI's newer name, then the older one): recorded with the usage
    safety_identifier: Label | None = None
    user: Label | None = None
    metadata: Metadata | None = None  # chat only (the fields table refuses it on completions)


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    max_completion_tokens: Positive | None = None
    store: bool | None = None  # kept by the gateway (gateway/chats), never sent upstream
    # gateway extension (the Responses API's own field): "auto" drops the oldest turns that the
    # chosen model's context cannot hold (gateway/truncation.py) instead of refusing the request
    truncation: Literal["auto", "disabled"] | None = None


class CompletionRequest(_Common, kw_only=True):
    # str, list[str], list[int] or list[list[int]]: msgspec unions hold one array type, so the
    # items are checked in estimate_prompt_sizes
    prompt: str | list[Any]
    # 0 only with echo: the prompt is read (its tokens scored, with logprobs), nothing generated
    max_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    echo: bool = False
    best_of: Annotated[int, msgspec.Meta(ge=1, le=MAX_N)] | None = None  # candidates, n returned


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """OpenAI's embeddings request, as far as the gateway checks it (the server checks the rest)."""

    model: str
    # str, list[str], list[int] or list[list[int]] (checked in estimate_prompt_sizes)
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Positive | None = None
    user: Label | None = None
    tier: Tier | None = None
    priority: Tier | None = None
    request_id: str | None = None


class RerankDocument(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    """A rerank request in the shape Cohere's, Jina's and vLLM's APIs share, as far as the gateway
    checks it."""

    model: str
    query: Annotated[str, msgspec.Meta(min_length=1)]
    documents: Annotated[
        list[str | RerankDocument], msgspec.Meta(min_length=1, max_length=MAX_RERANK_DOCUMENTS)
    ]
    top_n: Positive | None = None
    return_documents: bool = False
    max_tokens_per_doc: Positive | None = None
    user: Label | None = None
    tier: Tier | None = None
    priority: Tier | None = None
    request_id: str | None = None


class ImageRequest(msgspec.Struct, kw_only=True):
    """OpenAI's image generation request, as far as the gateway checks it (the provider checks
    the rest: sizes, qualities and formats differ by model)."""

    model: str
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=32000)]
    n: Annotated[int, msgspec.Meta(ge=1, le=10)] = 1
    stream: Literal[False] = False  # partial images are not relayed
    user: Label | None = None
    tier: Tier | None = None
    priority: Tier | None = None
    request_id: str | None = None


class SpeechRequest(msgspec.Struct, kw_only=True):
    """OpenAI's text-to-speech request, as far as the gateway checks it (voices, formats and
    speeds are the provider's business)."""

    model: str
    input: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    voice: str | dict[str, Any]
    # the audio is relayed whole, as OpenAI's default; its SSE form (audio in base64 events) is not
    stream_format: Literal["audio"] = "audio"
    # the team's end user, recorded and checked as for any request; not OpenAI's field here, so
    # never sent on
    user: Label | None = None
    tier: Tier | None = None
    priority: Tier | None = None
    request_id: str | None = None


Kind = Literal[
    "chat", "completion", "embedding", "rerank", "image", "transcription", "translation", "speech"
]
# the kinds that generate text: the others read their inputs, and have no output cap
GENERATING = ("chat", "completion")
# the kinds whose prompt the guard reads before it goes upstream
SCREENED = (*GENERATING, "image", "speech")
# the kinds whose request is a multipart form with a file (gateway/audio.py reads it)
UPLOADED = ("transcription", "translation")
# the catalog's kind of model that serves each endpoint's kind, where the two differ
_SERVED_BY = {"completion": "chat", "translation": "transcription"}


def served_by(kind: Kind) -> str:
    """The catalog kind of the models that serve an endpoint's kind."""
    return _SERVED_BY.get(kind, kind)


@dataclass
class Parsed:
    """A checked request: what the gateway needs, and the body to forward."""

    model: str
    body: dict[str, Any]  # forwarded upstream (extension fields removed)
    stream: bool
    include_usage: bool  # the client asked for the usage chunk
    prompt_sizes: list[int]  # token estimate of each prompt the upstream runs (a list: legacy)
    max_tokens: int | None  # as asked; None: fill in from the caps
    n: int  # sequences the upstream runs per prompt (best_of's candidates, where more than n)
    tier: Tier | None
    client_request_id: str | None  # the body's `request_id`; headers may name one too
    end_user: str | None = None  # who the team asked for (`safety_identifier`, else `user`)
    metadata: dict[str, str] | None = None  # the team's labels of the request, recorded with it
    truncate: bool = False  # chat with truncation "auto": the oldest turns may be dropped to fit
    dropped: int = 0  # messages truncation dropped
    upload: Upload | None = None  # a form's file (audio to transcribe), sent on with the body
    # what the request itself measures that its model is priced by (an audio file's seconds, a
    # speech's characters), for replies that report no usage of their own
    metered: Usage | None = None
    # the reply is the provider's own bytes, relayed as they arrive (speech's audio)
    relayed: bool = False

    @property
    def prompt_tokens(self) -> int:
        """All prompts' tokens: what the upstream reads."""
        return sum(self.prompt_sizes)

    @property
    def choices(self) -> int:
        """Sequences the upstream runs: every prompt, n times."""
        return len(self.prompt_sizes) * self.n


_PATH = re.compile(r"`\$\.([A-Za-z_]+)")  # "… at `$.n`", "… at `key` in `$.metadata`"
_MISSING = re.compile(r"missing required field `([A-Za-z_]+)`")


def _bad(message: str, param: str | None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def _text_bytes(content: str | list[dict[str, Any]] | None) -> int:
    """UTF-8 size of the text in a message content (string or list of parts). A part's `text` must
    be a string: everything downstream (router, affinity, the upstream) reads it as one."""
    if isinstance(content, str):
        return len(content.encode())
    size = 0
    for part in content or ():
        text = part.get("text", "")
        if not isinstance(text, str):
            raise _bad("a content part's 'text' must be a string", "messages")
        size += len(text.encode())
    return size


def estimate_chat_tokens(messages: list[Message]) -> int:
    return chat_tokens(sum(_text_bytes(m.content) for m in messages), len(messages))


def chat_tokens(size: int, messages: int) -> int:
    """The estimate of a chat prompt of `messages` messages whose texts are `size` bytes."""
    return math.ceil(size / 4) + TOKENS_PER_MESSAGE * messages + TOKENS_PER_REPLY


def message_bytes(message: dict[str, Any]) -> int:
    """UTF-8 size of a checked message's text (as estimate_chat_tokens counts it)."""
    return _text_bytes(message.get("content"))


def _is_ids(prompt: list[Any]) -> bool:
    return all(isinstance(p, int) and not isinstance(p, bool) for p in prompt)


def estimate_prompt_sizes(prompt: str | list[Any], param: str = "prompt") -> list[int]:
    """Each prompt's tokens: token ids counted exactly, text estimated. A list of prompts runs
    every one of them, so each is sized (the reservation is their sum). `param`: the field's name
    (`input` for embeddings)."""
    if isinstance(prompt, str):
        return [math.ceil(len(prompt.encode()) / 4)]
    if not prompt:
        raise _bad(f"{param} must not be an empty list", param)
    if _is_ids(prompt):
        return [len(prompt)]
    sizes = []
    for item in prompt:
        if isinstance(item, str):
            sizes.append(math.ceil(len(item.encode()) / 4))
        elif isinstance(item, list) and _is_ids(item):
            sizes.append(len(item))
        else:
            raise _bad(
                f"{param} must be a string, a list of strings, a token-id list or a list of them",
                param,
            )
    return sizes


def client_request_id(value: str | None, param: str) -> str | None:
    """A client's own id for its request, checked: kept beside the gateway's id (never instead of
    it: ids the client chooses are neither unique nor trustworthy)."""
    if value is None or value == "":
        return None
    if not _CLIENT_ID.fullmatch(value):
        raise _bad(
            f"a client request id is 1 to {MAX_CLIENT_ID} printable ASCII characters without "
            "spaces",
            param,
            "invalid_request_id",
        )
    return value


_D = TypeVar("_D", int, None)


def query_int(params: Mapping[str, str], name: str, low: int, high: int, default: _D) -> int | _D:
    """A whole number from the query (a page's `limit`, a cursor id): `default` when absent,
    else a 400 naming it unless it is from `low` to `high`."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise GatewayError(400, f"{name} must be a whole number from {low} to {high}", param=name)
    return int(raw)


def decode_json(raw: bytes) -> Any:
    """The body as JSON, or a 400: malformed, not UTF-8, or nested deeper than the decoder's
    recursion limit."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    except RecursionError:
        raise _bad("request body is nested too deeply", None, "invalid_json") from None


def parse(raw: bytes, kind: Kind) -> Parsed:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object", None)
    if kind == "embedding":
        return _parse_embedding(body)
    if kind == "rerank":
        return _parse_rerank(body)
    if kind == "image":
        return _parse_image(body)
    if kind == "speech":
        return _parse_speech(body)
    struct = ChatRequest if kind == "chat" else CompletionRequest
    req = convert(body, struct)

    if isinstance(req, ChatRequest):
        if "prompt" in body:
            raise _bad("chat completions take 'messages', not 'prompt'", "prompt")
        # OpenAI's newer name wins; the engine takes max_tokens
        max_tokens = req.max_completion_tokens or req.max_tokens
        body.pop("max_completion_tokens", None)
        body.pop("store", None)
        body.pop("truncation", None)
        _check_messages(req.messages)
        prompt_sizes = [estimate_chat_tokens(req.messages)]
    else:
        # OpenAI's legacy completions default to 16 tokens; forward that explicitly
        max_tokens = req.max_tokens if "max_tokens" in body else 16
        if max_tokens == 0 and not req.echo:
            raise _bad("max_tokens must be at least 1 (0 only with echo)", "max_tokens")
        prompt_sizes = estimate_prompt_sizes(req.prompt)
    runs = req.n
    if isinstance(req, CompletionRequest) and req.best_of is not None:
        runs = max(runs, req.best_of)  # the quotas hold every candidate the upstream draws
    if len(prompt_sizes) * runs > MAX_CHOICES:
        raise _bad(f"prompts × n must be at most {MAX_CHOICES}", "prompt")
    for field in ("tier", "priority", "request_id"):
        body.pop(field, None)
    return Parsed(
        model=req.model,
        body=body,
        stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        prompt_sizes=prompt_sizes,
        max_tokens=max_tokens,
        n=runs,
        tier=req.tier or req.priority,
        client_request_id=client_request_id(req.request_id, "request_id"),
        end_user=end_user(req.safety_identifier or req.user),
        metadata=req.metadata or None,
        truncate=isinstance(req, ChatRequest) and req.truncation == "auto",
    )


def end_user(value: str | None) -> str | None:
    """The end user a request names, as recorded: bounded, since the client chooses it."""
    return value[:MAX_END_USER] if value else None


def convert(body: Any, struct: type[_S]) -> _S:
    """`body` as `struct`, or a 400 naming the field at fault."""
    try:
        return msgspec.convert(body, struct)
    except msgspec.ValidationError as exc:
        text = str(exc)
        found = _PATH.search(text) or _MISSING.search(text)
        param = found.group(1) if found else None
        if "x00]" in text:  # _NO_NUL's regex says nothing to a person
            text = f"{param} must not contain NUL characters"
        raise _bad(text, param) from None


def _parse_embedding(body: dict[str, Any]) -> Parsed:
    """An embeddings request: its inputs are the prompts, and nothing is generated."""
    req = convert(body, EmbeddingRequest)
    sizes = estimate_prompt_sizes(req.input, "input")
    if len(sizes) > MAX_EMBEDDING_INPUTS:
        raise _bad(f"input holds at most {MAX_EMBEDDING_INPUTS} items", "input")
    return _reading(body, req, sizes)


def _parse_rerank(body: dict[str, Any]) -> Parsed:
    """A rerank request: each document is read with the query, as a cross-encoder reads them (an
    embedding model reads the query once: the settled usage says what was read)."""
    req = convert(body, RerankRequest)
    query = math.ceil(len(req.query.encode()) / 4)
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    sizes = [query + math.ceil(len(t.encode()) / 4) for t in texts]
    return _reading(body, req, sizes)


def _parse_image(body: dict[str, Any]) -> Parsed:
    """An image request: its prompt is read; what is generated (images' tokens, where the model
    counts them) is settled from the reply's usage, with no output cap to reserve."""
    req = convert(body, ImageRequest)
    return _reading(body, req, [math.ceil(len(req.prompt.encode()) / 4)], req.n)


def _parse_speech(body: dict[str, Any]) -> Parsed:
    """A speech request: its text is read aloud, priced by its characters (OpenAI's replies are
    the audio alone, with no usage)."""
    req = convert(body, SpeechRequest)
    parsed = _reading(body, req, [math.ceil(len(req.input.encode()) / 4)])
    body.pop("user", None)
    parsed.metered = Usage(characters=len(req.input))
    parsed.relayed = True
    return parsed


def _reading(
    body: dict[str, Any],
    req: EmbeddingRequest | RerankRequest | ImageRequest | SpeechRequest,
    sizes: list[int],
    n: int = 1,
) -> Parsed:
    """The Parsed of a request that reads its inputs and generates no text, so has no output
    cap: an embedding, a ranking, `n` images, speech."""
    for field in ("tier", "priority", "request_id"):
        body.pop(field, None)
    return Parsed(
        model=req.model,
        body=body,
        stream=False,
        include_usage=False,
        prompt_sizes=sizes,
        max_tokens=0,
        n=n,
        tier=req.tier or req.priority,
        client_request_id=client_request_id(req.request_id, "request_id"),
        end_user=end_user(req.user),
    )
