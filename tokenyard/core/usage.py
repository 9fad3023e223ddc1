"""The usage of one request as every package sees it: the counts an upstream reports, the event
the gateway appends to the Redis stream when the request settles, and the stream's name. Billing
turns the event into a UsageRecord row; the gateway prices it through a Pricer it is handed."""

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

USAGE_STREAM = "ty:usage-events"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # of the prompt tokens, those written to the provider's prompt cache: Anthropic charges a
    # premium for them (Price.cache_write_input)
    cache_write_tokens: int = 0
    reported: bool = False  # by the upstream (else the gateway's estimate)
    # what audio models are priced by besides tokens: seconds of audio transcribed (whisper-1's
    # per-minute price), characters of text spoken (tts-1's per-character price)
    audio_seconds: float = 0.0
    characters: int = 0


class Pricer(Protocol):
    """Prices a settled request: puts its costs into the usage event and returns the dollars
    charged to the team (billing.settle.Pricer is the platform's)."""

    def __call__(self, team: str, model: str, usage: Usage, event: "UsageEvent") -> float: ...


class UsageEvent(msgspec.Struct):
    """One request's usage event: the gateway fills it in as the request goes and appends it to
    the stream at settle; billing decodes it. Fields the gateway may not know default."""

    request_id: str
    team: str
    model: str
    model_served: str
    ts: float  # when the request started (unix seconds)
    client_request_id: str | None = None
    status: int = 0
    key_prefix: str = ""
    end_user: str | None = None  # the team's own user the request was for, as the client named it
    metadata: dict[str, str] | None = None  # the request's own labels (OpenAI's `metadata`)
    provider: str = ""
    tier: str = ""
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    audio_seconds: float = 0.0
    characters: int = 0
    usage_reported: bool = False
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0
    e2e: float = 0.0
    timings: dict[str, Any] | None = None  # the engine's: queue, ttft, compute (self-hosted)
    ttft: float | None = None  # the gateway's own first-byte time, where it measured one
    finish_reason: str | None = None
    error: str | None = None
    route_features: str | None = None  # model="auto": the router's view of the prompt
    cache_hit: bool = False  # answered from the gateway's response cache: nothing upstream
    # the gateway's sizing: the prompt's tokens estimated from its bytes (single prompts only, None
    # otherwise), and those reserved with the learned overhead (the usage charged when the upstream
    # reports none)
    prompt_estimate: int | None = None
    prompt_reserved: int = 0
