"""What the gateway does for billing as a request settles, all in memory or Redis (never SQL): price
the usage into the event, count it, and charge the team's daily dollar budget."""

import logging
from typing import Any

from redis.exceptions import RedisError

from billing.metrics import COST
from billing.pricing import Costs, costs
from gateway.quotas import Quotas, Reservation, Usage
from router.catalog import ModelEntry

log = logging.getLogger("tokenyard.billing")


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


async def charge(quotas: Quotas, res: Reservation, priced: Costs) -> None:
    """Add the spend to the team's dollars for the day it reserved on, which the next reservation
    checks. Only for teams with a budget: the others are spared a Redis round trip."""
    if not (res.enforced and res.policy.usd_per_day > 0 and priced.charged > 0):
        return
    try:
        await quotas.record_spend(res.policy.team, priced.charged, res.day)
    except RedisError as exc:
        log.warning("could not charge team %s's daily dollars: %s", res.policy.team, exc)
