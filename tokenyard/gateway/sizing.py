"""What a request may run and reserve: its prompt's size (the byte estimate and what it is known to
miss), its max_tokens under the team's, the platform's and the model's caps, and the KV-cache pages
it can occupy on a paged engine."""

import math
from dataclasses import dataclass, field

from tokenyard.backends.base import ModelInfo
from tokenyard.core.errors import GatewayError
from tokenyard.core.settings import Settings
from tokenyard.gateway.validation import Parsed
from tokenyard.tenancy.policy import TeamPolicy

# the most a prompt's template and default system prompt may add to its byte estimate (tokens)
MAX_PROMPT_OVERHEAD = 256.0


@dataclass
class PromptOverhead:
    """Prompt tokens the byte estimate misses (chat template, default system prompt), per model and
    team, learned from the usage upstreams report. Per team and bounded: what one team sends (long
    lists of prompts, text that tokenizes densely) must never grow the estimate, and so refuse the
    requests, of another."""

    learned: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, model: str, team: str, estimate: int, actual: int) -> None:
        """One request of a single prompt: its estimate from the bytes and its actual tokens."""
        old = self.learned.get((model, team), 0.0)
        new = old + 0.1 * ((actual - estimate) - old)
        self.learned[(model, team)] = min(max(new, 0.0), MAX_PROMPT_OVERHEAD)

    def extra(self, model: str, team: str) -> int:
        return round(self.learned.get((model, team), 0.0))


def min_set(*caps: int) -> int:
    """The tightest of the caps that are set (0 = unset)."""
    return min((c for c in caps if c > 0), default=0)


def prompt_budget(parsed: Parsed, info: ModelInfo, policy: TeamPolicy, settings: Settings) -> int:
    """The most prompt tokens that leave the output room in the model's context under the caps:
    the max_tokens asked, else a quarter of the context (at most the token cap). 0: no context
    cap."""
    context = min_set(policy.max_context, settings.gateway_max_context, info.max_model_len)
    token_cap = min_set(policy.max_tokens, settings.gateway_max_tokens)
    return context and context - (parsed.max_tokens or min_set(token_cap, context // 4))


def max_tokens_for(
    parsed: Parsed, prompt: int, info: ModelInfo, policy: TeamPolicy, settings: Settings
) -> int:
    """The max_tokens to forward, after the token and context caps; `prompt` is the largest of
    the request's prompts (each runs in its own context)."""
    token_cap = min_set(policy.max_tokens, settings.gateway_max_tokens)
    context = min_set(policy.max_context, settings.gateway_max_context, info.max_model_len)
    if context and prompt >= context:
        raise GatewayError(
            400,
            f"the prompt (about {prompt} tokens) does not fit the context limit of {context}",
            code="context_length_exceeded",
            param=next(
                (p for p in ("messages", "input", "documents") if p in parsed.body), "prompt"
            ),
        )
    if parsed.max_tokens is None:  # unset: as much as the caps allow
        return min_set(token_cap, context - prompt if context else 0) or 256
    if token_cap and parsed.max_tokens > token_cap:
        raise GatewayError(
            400,
            f"max_tokens is {parsed.max_tokens}, above this team's cap of {token_cap}",
            code="max_tokens_exceeded",
            param="max_tokens",
        )
    if context and prompt + parsed.max_tokens > context:
        raise GatewayError(
            400,
            f"prompt (about {prompt} tokens) + max_tokens ({parsed.max_tokens}) exceeds the "
            f"context limit of {context}",
            code="context_length_exceeded",
            param="max_tokens",
        )
    return parsed.max_tokens


def kv_pages(prompt_tokens: int, max_tokens: int, n: int, block_size: int) -> int:
    """Pages a request can occupy on a paged engine; 0 where the model is not self-hosted."""
    if block_size <= 0:
        return 0
    return n * math.ceil((prompt_tokens + max_tokens) / block_size)
