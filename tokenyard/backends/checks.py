"""A model's places checked with the smallest real request each (LiteLLM's /health): every
deployment of a commercial model, every replica of a self-hosted one, tried once, at once, with no
retry, no cooldown and no breaker, so an operator sees which key, identity, region or server is
wrong right after a change. Each check costs what one such request costs (a token of output)."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tokenyard.backends.retry import Retryable
from tokenyard.core.errors import refusal_message

CHECK_TIMEOUT_S = 30.0
# the smallest request of each kind a model serves: path and body (the model is each place's own)
PINGS: dict[str, tuple[str, dict[str, object]]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1},
    ),
    "embedding": ("/v1/embeddings", {"input": "ping"}),
    "rerank": ("/v1/rerank", {"query": "ping", "documents": ["ping"]}),
    "speech": ("/v1/audio/speech", {"input": ".", "voice": "alloy"}),  # one character spoken
}


@dataclass
class Check:
    model: str
    at: str  # the deployment's name, or the replica's URL
    ok: bool
    status: int | None  # the answer's HTTP status; None: no answer (refused, timed out)
    latency_ms: float
    error: str = ""  # what went wrong, in the upstream's words where it gave some


async def check(
    model: str,
    at: str,
    send: Callable[[], Awaitable[tuple[int, bytes]]],
    timeout_s: float = CHECK_TIMEOUT_S,
) -> Check:
    """`send` once: its status and an OpenAI-shaped body."""
    started = time.perf_counter()
    status: int | None = None
    error = ""
    try:
        async with asyncio.timeout(timeout_s):
            status, body = await send()
        if status != 200:
            error = refusal_message(body)
    except Retryable as exc:  # 429, 5xx, no connection, no token or identity
        status, error = exc.status, exc.reason
    except TimeoutError:
        error = f"no answer within {timeout_s:g} s"
    elapsed = (time.perf_counter() - started) * 1000
    return Check(model, at, status == 200, status, round(elapsed, 1), error)
