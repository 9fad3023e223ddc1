"""How a request settles, once, whatever way it ended: the usage it is charged (the upstream's
report, else the gateway's estimate), its metrics, its price (billing's Pricer, handed in), and the
quota script that releases the reservation and appends the usage event."""

import time

from tokenyard.core.usage import Pricer, Usage, UsageEvent
from tokenyard.gateway import metrics
from tokenyard.gateway.quotas import LeaseKeeper, Quotas, Reservation
from tokenyard.gateway.sizing import PromptOverhead
from tokenyard.gateway.streaming import Reply, UsageIn


def usage_of(got: UsageIn | None, fallback_prompt: int, fallback_completion: int) -> Usage:
    if got is None:  # the upstream never reported: settle the estimate
        return Usage(fallback_prompt, fallback_completion, 0)
    return Usage(got.prompt, got.completion, got.cached, got.written, reported=True)


def reply_usage(got: Reply | None, prompt_reserved: int, metered: Usage | None) -> Usage:
    """A whole 200 reply's usage (`got`: None where it is not JSON, as audio is): the tokens it
    reports, else the prompt's estimate. A request that measures what its model is priced by
    (`metered`: a speech's characters, an audio file's seconds) settles that, the seconds as the
    reply states them where it does (whisper-1's usage, verbose_json's duration)."""
    reported = got.usage if got is not None else None
    if metered is None:
        return usage_of(reported, prompt_reserved, 0) if got is not None else Usage()
    usage = usage_of(reported, 0, 0)
    stated = (reported.seconds if reported else 0.0) or (got.duration if got else None)
    usage.audio_seconds = stated or metered.audio_seconds
    usage.characters = metered.characters
    return usage


class Settlement:
    def __init__(
        self, quotas: Quotas, keeper: LeaseKeeper, price: Pricer, overhead: PromptOverhead
    ) -> None:
        self.quotas = quotas
        self.keeper = keeper
        self.price = price
        self.overhead = overhead

    async def settle(
        self,
        res: Reservation,
        model: str,
        usage: Usage,
        event: UsageEvent,
        started: float,
        status: int,
    ) -> None:
        if self.keeper.active.pop(res.lease_id, None) is None:
            return  # already settled
        metrics.IN_FLIGHT.dec()
        team = res.policy.team
        if usage.reported and usage.prompt_tokens and event.prompt_estimate is not None:
            self.overhead.observe(model, team, event.prompt_estimate, usage.prompt_tokens)
        elapsed = time.perf_counter() - started
        event.status = status
        event.prompt_tokens = usage.prompt_tokens
        event.completion_tokens = usage.completion_tokens
        event.cached_tokens = usage.cached_tokens
        event.cache_write_tokens = usage.cache_write_tokens
        event.audio_seconds, event.characters = usage.audio_seconds, usage.characters
        event.e2e = elapsed
        metrics.REQUESTS.labels(model, str(status)).inc()
        metrics.LATENCY.labels(model, "1" if event.stream else "0").observe(elapsed)
        metrics.TOKENS.labels(team, model, "prompt").inc(usage.prompt_tokens)
        metrics.TOKENS.labels(team, model, "completion").inc(usage.completion_tokens)
        metrics.TOKENS.labels(team, model, "cached").inc(usage.cached_tokens)
        attributes = {
            "tokenyard.model": model,
            "tokenyard.prompt_tokens": usage.prompt_tokens,
            "tokenyard.completion_tokens": usage.completion_tokens,
        }
        try:
            with res.trace.span("settle", **attributes):
                await self.quotas.settle(res, usage, event, self.price(team, model, usage, event))
        finally:
            res.trace.end(status)
