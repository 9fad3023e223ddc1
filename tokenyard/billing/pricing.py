"""What a request costs, known in memory when it settles (the request path never touches SQL).

Commercial models: the catalog's list price per 1M input, cached input, cache-written input and
output tokens (audio models: per minute of audio, per 1M characters).
Self-hosted models: the request's measured engine time (its share of each engine step's wall time,
split by tokens processed; the engine reports it as `timings.compute`) × the replica's $/hour; the
list-price figure is kept beside it so the two can be compared.
"""

from dataclasses import dataclass
from typing import Any

from tokenyard.core.usage import Usage
from tokenyard.router.catalog import ModelEntry


@dataclass(frozen=True)
class Costs:
    charged: float = 0.0  # what the team pays, and what its daily dollar budget counts
    list: float = 0.0  # the per-token list price


def costs(entry: ModelEntry | None, usage: Usage, timings: dict[str, Any] | None) -> Costs:
    if entry is None:  # not in the catalog: nothing to price it by
        return Costs()
    listed = entry.price.cost(
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.cache_write_tokens,
        usage.audio_seconds,
        usage.characters,
    )
    compute = (timings or {}).get("compute")
    if entry.provider == "self-hosted" and isinstance(compute, int | float):
        return Costs(compute * entry.usd_per_hour / 3600, listed)
    # commercial, or an engine that reported no timings: the list price is all there is
    return Costs(listed, listed)
