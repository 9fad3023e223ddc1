"""Requests the gateway answers without a model generating (moderations, token counts), metered
like any request: the quota script's reserve takes one of the team's, the key's and the end
user's requests per minute, a place in their concurrency and whatever tokens the work uses; the
settle writes its usage record (at no charge: `model_served` names no catalog model)."""

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import Usage, UsageEvent
from tokenyard.gateway import metrics
from tokenyard.gateway.quotas import Reservation
from tokenyard.gateway.settlement import Settlement
from tokenyard.tenancy.policy import TeamPolicy


@dataclass
class Meter:
    reservation: Reservation
    event: UsageEvent
    usage: Usage = field(default_factory=Usage)
    status: int = 500  # what the record says unless the work sets its outcome

    @property
    def headers(self) -> dict[str, str]:
        return {"x-request-id": self.event.request_id, **self.reservation.headers}


@asynccontextmanager
async def metered(
    settlement: Settlement,
    policy: TeamPolicy,
    request_id: str,
    *,
    model: str,
    served: str,
    tokens: int = 0,
    end_user: str | None = None,
) -> AsyncIterator[Meter]:
    """Reserve (a 429 raises here, before any work), run the body, settle whatever way it ends.
    `model`: what the client asked for; `served`: the gateway's own service that answered."""
    started = time.perf_counter()
    lease_id = os.urandom(9).hex()
    res = await settlement.quotas.reserve(policy, lease_id, tokens, 0, False, end_user, served)
    settlement.keeper.active[lease_id] = res
    metrics.IN_FLIGHT.inc()
    event = UsageEvent(
        request_id=request_id,
        team=policy.team,
        model=model,
        model_served=served,
        tier="interactive",
        end_user=end_user,
        prompt_reserved=tokens,
        ts=time.time(),
        key_prefix=policy.key_prefix,
    )
    meter = Meter(res, event)
    try:
        yield meter
    except GatewayError as exc:
        meter.status = exc.status
        raise
    finally:
        await settlement.settle(res, served, meter.usage, event, started, meter.status)
