"""The one interface between the gateway and whatever serves a model.

`Upstream` is all the gateway knows about a backend: send an OpenAI-protocol request (whole or
streamed) and say what the model is (readiness, KV block size, context window, load). Whatever the
provider speaks, a backend answers in OpenAI's shapes: a `chat.completion` body, or SSE events of
`chat.completion.chunk`s ending with a usage chunk (and `timings` where the engine measured them).
"""

import hashlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tokenyard.core.errors import GatewayError

if TYPE_CHECKING:  # checks.py builds on retry.py, which builds on this module
    from tokenyard.backends.checks import Check

log = logging.getLogger("tokenyard.backends")


def rendezvous(key: bytes, name: str, weight: float = 1.0) -> float:
    """Weighted rendezvous hashing: of the places (engine replicas, deployments) that could serve
    a prompt prefix (`key`), the one of the highest score is its home; over many prefixes each
    place is home to a share in proportion to its weight, and removing one moves only its own."""
    digest = hashlib.blake2b(key + name.encode(), digest_size=8).digest()
    uniform = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)  # in (0, 1)
    return weight / -math.log(uniform)


class UpstreamBroken(Exception):
    """The upstream failed after the response started (connection lost mid-stream)."""


class StreamRefusal(Exception):
    """A refusal inside a 200 stream (Anthropic's `error` event, Gemini's error object), in
    OpenAI's shape: before the stream's first token it is the request's answer (retried when 429
    or 5xx), after it the stream's break."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"refused in the stream with {status}")
        self.status = status
        self.body = body


@dataclass
class ModelInfo:
    name: str
    ready: bool = False
    block_size: int = 0  # 0: not a paged self-hosted engine, no KV-page quota
    max_model_len: int = 0  # 0: unknown
    waiting: int = 0  # requests queued upstream at the last poll (the least-loaded replica's)
    kv_usage: float = 0.0  # share of KV blocks in use at the last poll (the least-loaded replica's)
    provider: str = "self-hosted"
    circuit: str = "closed"  # the breaker's state: closed, open, half_open (never routed to: open)
    max_tokens_param: str = "max_tokens"  # the field its requests cap their output with


# the paths whose 200 reply is the provider's own bytes (audio), relayed as they arrive
BYTES_PATHS = ("/v1/audio/speech",)


@dataclass(frozen=True)
class Upload:
    """A file sent with a request as a multipart form's `file` (audio to transcribe)."""

    filename: str
    content: bytes
    content_type: str


@dataclass
class UpstreamCall:
    path: str  # /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, ...
    # JSON; with an upload, the form's other fields as a JSON object
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # x-tenant, x-priority, x-request-id
    # the prompt's start (router.policy.prefix_text), from the body the gateway already parsed:
    # engine replicas are picked by it, so requests sharing a cached prefix meet on one replica
    prefix: str = ""
    # the team's deployment_tags: a commercial model's deployments that lack any are never called
    tags: frozenset[str] = frozenset()
    # what a deployment's tokens-per-minute limit counts for it: the prompt's estimate and the
    # output cap, over all choices
    tokens: int = 0
    upload: Upload | None = None  # sent as a multipart form with `body`'s fields


@dataclass
class UpstreamReply:
    status: int
    body: bytes
    content_type: str


class UpstreamStream(Protocol):
    status: int
    content_type: str  # text/event-stream; a refusal's application/json; speech's audio type

    async def read_all(self) -> bytes:
        """The whole body: for refusals (status >= 400), which are JSON, not SSE."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Raw SSE bytes as they arrive (no framing guaranteed)."""
        ...

    async def aclose(self) -> None:
        """Drop the connection: the engine cancels the sequence and frees its KV blocks."""
        ...


class Upstream(Protocol):
    info: ModelInfo

    async def complete(self, call: UpstreamCall) -> UpstreamReply: ...

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream: ...

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        """The prompt's tokens as this model reads it (template and tools included), from the
        upstream's own counting route: 200 with `{"input_tokens": n}`, or its refusal in OpenAI's
        error shape; None where it has no such route for this request."""
        ...

    async def refresh(self) -> None:
        """Re-read readiness and load; called periodically."""
        ...

    async def check(self, kind: str) -> "list[Check]":
        """Each place it is served (deployment, replica) tried once with the smallest real
        request of `kind` (backends/checks.py)."""
        ...

    async def aclose(self) -> None: ...


def serves_only(model: str, path: str) -> GatewayError:
    """The 400 for a request at an endpoint a model does not serve."""
    message = f"model {model!r} serves only {path}"
    return GatewayError(400, message, code="unsupported_endpoint", param="model")


class BackendUnavailable(GatewayError):
    """The backend failed before the first byte of its reply (after its own retries): nothing
    reached the client, so the gateway may try the next model of the route."""


# how servers say a prompt does not fit the model's window where they give no code of OpenAI's:
# Anthropic ("prompt is too long: ... maximum"), vLLM ("maximum context length is ..."),
# llama.cpp's server ("exceeds the available context size"), Gemini ("input token count ...
# exceeds the maximum number of tokens")
CONTEXT_WORDS = (
    "maximum context length",
    "prompt is too long",
    "exceeds the available context size",
    "input token count",
)
CONTEXT_CODES = ("context_length_exceeded", "exceed_context_size_error")


def context_exceeded(status: int, body: bytes) -> bool:
    """Whether an upstream's refusal (an OpenAI-shaped error, as every backend answers) says the
    prompt and its output cap do not fit the model's context window."""
    if status not in (400, 413):
        return False
    try:
        error = json.loads(body).get("error") or {}
        text, code = str(error.get("message", "")).lower(), (error.get("code"), error.get("type"))
    except (ValueError, AttributeError):
        return False
    return any(c in CONTEXT_CODES for c in code) or any(w in text for w in CONTEXT_WORDS)


class BufferedStream:
    """A streamed request the upstream refused: status >= 400 and a JSON error body, no SSE."""

    content_type = "application/json"

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self._body = body

    async def read_all(self) -> bytes:
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    async def aclose(self) -> None:
        pass


class LiveStream:
    """A 200 stream whose first bytes already arrived (the point of no retry). `source` raises
    UpstreamBroken if the upstream fails later; `broken` is told (the circuit breaker counts it).
    SSE events in OpenAI's shapes, or the provider's own bytes (`content_type`: speech's audio)."""

    status = 200

    def __init__(
        self,
        source: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        broken: Callable[[], Awaitable[None]],
        content_type: str = "text/event-stream",
    ) -> None:
        self.content_type = content_type
        self._source = source
        self._close: Callable[[], Awaitable[None]] | None = close
        self._broken = broken

    async def read_all(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._source:
                yield chunk
        except UpstreamBroken:
            await self._broken()
            raise

    async def aclose(self) -> None:
        """Once: closing is what ends the request's share of the replica's load."""
        close, self._close = self._close, None
        if close is not None:
            await close()


def counted(tokens: int) -> UpstreamReply:
    """A count_tokens answer, whatever the upstream's own shape was."""
    return UpstreamReply(200, b'{"input_tokens":%d}' % tokens, "application/json")


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> bytes:
    """OpenAI's error shape, for refusals a backend translates from another provider's."""
    detail = {"message": message, "type": kind, "param": param, "code": code}
    return json.dumps({"error": detail}).encode()
