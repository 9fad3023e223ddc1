"""What the engine gives back, as the server and the OpenAI protocol read it: a refused request's
error, each step's tokens and text for one choice, and a finished sequence's accounting. A leaf:
nothing here needs the model or torch."""

from dataclasses import dataclass, field


class RequestError(ValueError):
    """A request the engine can never serve; maps to an OpenAI-style 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class Sampled:
    """One token a step emitted, with its logprobs when the request asked for them."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    rank: int | None = None  # a scored prompt token's: 1 + how many tokens were likelier there


@dataclass
class SeqStats:
    """A finished sequence's accounting, for usage and billing."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue: float
    prefill: float
    ttft: float
    e2e: float
    compute: float
    token_gaps: list[float]
    preemptions: int
    predicted_tokens: int = 0  # the length of the output the client predicted (0: none)
    accepted_prediction_tokens: int = 0  # draft tokens verification accepted, where predicted


@dataclass
class RequestOutput:
    """What one step produced for one choice of one request."""

    request_id: str
    choice: int
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Sampled] = field(default_factory=list)
    # its first output, where the request scores its prompt: the prompt's tokens after the first
    prompt_logprobs: list[Sampled] | None = None
    finish_reason: str | None = None  # stop | length | cancelled | error
    # vLLM's: the stop string or stop token id that ended it (None: EOS, or another reason)
    stop_reason: str | int | None = None
    stats: SeqStats | None = None  # set with finish_reason
