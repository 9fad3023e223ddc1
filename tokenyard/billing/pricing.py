"""What a request costs, known in memory when it settles (the request path never touches SQL).

Commercial models: the catalog's list price per 1M input, cached input, cache-written input and
output tokens.
Self-hosted models: the request's measured engine time (its share of each engine step's wall time,
split by tokens processed; the engine reports it as `timings.compute`) × the replica's $/hour; the
list-price figure is kept beside it so the two can be compared.
"""

from dataclasses import dataclass
from typing import Any

from tokenyard.router.catalog import ModelEntry


@dataclass(frozen=True)
class Costs:
    charged: float = 0.0  # what the team pays, and what its daily dollar budget counts
    list: float = 0.0  # the per-token list price


def costs(
    entry: ModelEntry | None,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    timings: dict[str, Any] | None,
    cache_write_tokens: int = 0,
) -> Costs:
    if entry is None:  # not in the catalog: nothing to price it by
        return Costs()
    listed = entry.price.cost(prompt_tokens, cached_tokens, completion_tokens, cache_write_tokens)
    compute = (timings or {}).get("compute")
    if entry.provider == "self-hosted" and isinstance(compute, int | float):
        return Costs(compute * entry.usd_per_hour / 3600, listed)
    # commercial, or an engine that reported no timings: the list price is all there is
    return Costs(listed, listed)
