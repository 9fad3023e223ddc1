"""What the gateway does for billing as a request settles, all in memory or Redis (never SQL): price
the usage into the event and count it; the settle script then charges the team's daily dollars.
The gateway holds it as a core.usage.Pricer, handed in where the app is assembled."""

from tokenyard.billing.metrics import COST
from tokenyard.billing.pricing import costs
from tokenyard.core.usage import Usage, UsageEvent
from tokenyard.router.catalog import Catalog


class Pricer:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def __call__(self, team: str, model: str, usage: Usage, event: UsageEvent) -> float:
        """Put the costs (and the fields they rest on) into the usage event; count them; return
        the dollars charged."""
        entry = self.catalog.get(model)
        priced = costs(entry, usage, event.timings)
        event.provider = entry.provider if entry else ""
        event.usage_reported = usage.reported
        event.cost_usd = priced.charged
        event.list_cost_usd = priced.list
        COST.labels(team, model, "charged").inc(priced.charged)
        COST.labels(team, model, "list").inc(priced.list)
        return priced.charged
