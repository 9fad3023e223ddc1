"""What the gateway does for billing as a request settles, all in memory or Redis (never SQL): price
the usage into the event and count it; the settle script then charges the team's daily dollars."""

from typing import Any

from billing.metrics import COST
from billing.pricing import Costs, costs
from gateway.quotas import Usage
from router.catalog import ModelEntry


def price(
    entry: ModelEntry | None, team: str, model: str, usage: Usage, event: dict[str, Any]
) -> Costs:
    """Put the costs (and the fields they rest on) into the usage event; count them."""
    priced = costs(
        entry,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        event.get("timings"),
    )
    event.update(
        provider=entry.provider if entry else "",
        usage_reported=usage.reported,
        cost_usd=priced.charged,
        list_cost_usd=priced.list,
    )
    COST.labels(team, model, "charged").inc(priced.charged)
    COST.labels(team, model, "list").inc(priced.list)
    return priced
