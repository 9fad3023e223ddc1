"""A request's admission to a model: sized for it (output cap, tokens, KV pages) and reserved in
Redis (gateway/quotas.py), passing over to the route's next usable candidate where a limit on one
model refuses it; and, when an upstream fails before its first byte, the reservation moved to the
candidate that takes the request instead.
"""

import os
from dataclasses import dataclass

from tokenyard.backends.base import ModelInfo, Upstream
from tokenyard.core.errors import GatewayError
from tokenyard.core.settings import Settings
from tokenyard.gateway import metrics, truncation
from tokenyard.gateway.dispatch import Dispatch
from tokenyard.gateway.quotas import MODEL_LIMIT_CODES, Quotas, Reservation
from tokenyard.gateway.sizing import PromptOverhead, kv_pages, max_tokens_for, prompt_budget
from tokenyard.gateway.tracing import RequestTrace
from tokenyard.gateway.validation import Parsed
from tokenyard.router.catalog import Catalog
from tokenyard.router.policy import Route
from tokenyard.tenancy.policy import TeamPolicy


def _model_limit_reason(code: str) -> str:
    """The overflow metric's reason for a refusal by a limit on one model: every team's, the
    key's own or the team's."""
    for whose in ("platform", "key"):
        if code.startswith(whose + "_"):
            return whose + "_model_limit"
    return "team_model_limit"


@dataclass
class Admitted:
    """A request sized and reserved: the route it is on (widened where the model first chosen
    could not hold it), the upstream that takes it, its output cap and its prompts' sizes."""

    res: Reservation
    route: Route
    upstream: Upstream
    max_tokens: int
    prompts: list[int]


class Admission:
    def __init__(
        self,
        settings: Settings,
        quotas: Quotas,
        dispatch: Dispatch,
        catalog: Catalog,
        overhead: PromptOverhead,
    ) -> None:
        self.settings = settings
        self.quotas = quotas
        self.dispatch = dispatch
        self.catalog = catalog
        self.overhead = overhead

    async def reserve(
        self,
        route: Route,
        upstream: Upstream,
        policy: TeamPolicy,
        parsed: Parsed,
        tier: str,
        trace: RequestTrace,
    ) -> Admitted:
        """Size the request for `upstream` and reserve it. Where the team's or the key's own limit
        on that model refuses it, or every team's limit on it (the catalog's), the route's next
        usable candidate takes it (an overflow, as for a saturated one); one of those whose
        context cannot hold the request is passed over. Where the model first chosen cannot hold
        it, its context fallbacks take it (an overflow with reason `context_window`)."""
        index, first = route.candidates.index(upstream.info.name), None
        while True:
            info, sized = upstream.info, False
            extra = self.overhead.extra(info.name, policy.team)
            self._truncate(parsed, info, policy, extra)
            prompts = [size + extra for size in parsed.prompt_sizes]
            try:
                max_tokens = max_tokens_for(parsed, max(prompts), info, policy, self.settings)
                sized = True
                # sized for everything the upstream runs: each prompt, n times
                tokens = sum(prompts) + parsed.choices * max_tokens
                pages = sum(kv_pages(s, max_tokens, parsed.n, info.block_size) for s in prompts)
                lease_id = os.urandom(9).hex()  # never the client's id: clients may reuse theirs
                with trace.span("quota.reserve", tokens=tokens, kv_pages=pages, tier=tier):
                    res = await self.quotas.reserve(
                        policy,
                        lease_id,
                        tokens,
                        pages,
                        tier == "batch",
                        parsed.end_user,
                        info.name,
                        self.platform_limits(info.name),
                    )
                return Admitted(res, route, upstream, max_tokens, prompts)
            except GatewayError as exc:
                limited = sized and exc.code in MODEL_LIMIT_CODES  # a limit on this model
                too_small = not sized and first is not None  # a candidate overflowed to
                widen = not sized and first is None and bool(route.wider)
                if not (limited or too_small or widen):
                    raise  # another limit, or the model first chosen cannot hold the request
                if limited:
                    metrics.OVERFLOWS.labels(info.name, _model_limit_reason(exc.code or "")).inc()
                first = first or exc  # the model first chosen is the one to name
                if widen:
                    metrics.OVERFLOWS.labels(info.name, "context_window").inc()
                    route, index = route.widened(), -1
                found = self.dispatch.next_open(route, tier, index + 1)
                if found is None:
                    raise first from None
                index, upstream = found

    def _truncate(self, parsed: Parsed, info: ModelInfo, policy: TeamPolicy, extra: int) -> None:
        """With truncation "auto", the oldest turns the model's context cannot hold are dropped
        (gateway/truncation.py). Dropped turns stay dropped if the request moves on to another
        candidate: a larger one gets a little less than it could hold."""
        if parsed.truncate and (budget := prompt_budget(parsed, info, policy, self.settings)):
            truncation.fit(parsed, budget - extra)

    def platform_limits(self, model: str) -> tuple[int, int]:
        """Every team's requests and tokens per minute on `model` together (the catalog's)."""
        entry = self.catalog.get(model)
        return (entry.rpm, entry.tpm) if entry is not None else (0, 0)

    async def fail_over(
        self, route: Route, res: Reservation, parsed: Parsed, cap: int, tier: str, after: int
    ) -> tuple[int, Upstream, int] | None:
        """The candidate, from index `after`, that takes a request whose upstream failed before
        its first byte (its index, its upstream and the output cap it gets), with the
        reservation moved there. The cap is the call's `cap` narrowed to what the candidate's
        context leaves, never widened: the reservation holds the first cap. One whose context
        cannot hold the request, or whose limits (the team's, every team's, the key's) refuse it,
        is passed over, as at reservation."""
        while (found := self.dispatch.next_open(route, tier, after)) is not None:
            after, info = found[0] + 1, found[1].info
            extra = self.overhead.extra(info.name, res.policy.team)
            self._truncate(parsed, info, res.policy, extra)
            prompt = max(parsed.prompt_sizes, default=0) + extra
            try:
                fits = max_tokens_for(parsed, prompt, info, res.policy, self.settings)
            except GatewayError:  # too long for this model's context
                continue
            refused = await self.quotas.move(res, info.name, self.platform_limits(info.name))
            if refused is None:
                return found[0], found[1], min(cap, fits)
            metrics.OVERFLOWS.labels(info.name, _model_limit_reason(refused)).inc()
        return None
