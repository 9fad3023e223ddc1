"""Property-based tests of the quota scripts (gateway/quotas.lua) on a real Redis server.

A hypothesis state machine interleaves reserve, settle, renew, lease expiry, gateway death (a
reservation never renewed nor settled) and fail-over to another model (a reservation moved) through
the real `Quotas` class, keeps a model of what
should be held, and checks after every step that Redis holds exactly that, that no admission ever
took more than a limit allows, that each refusal names a limit that really was reached, and at the
end that everything returns to zero.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import NamedTuple

import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.gateway.conftest import RedisServer
from tokenyard.core.errors import GatewayError
from tokenyard.core.usage import UsageEvent
from tokenyard.gateway.quotas import (
    PLATFORM_BATCH_LEASES,
    PLATFORM_LEASES,
    Quotas,
    Reservation,
    Usage,
    day_number,
)
from tokenyard.tenancy.policy import TeamPolicy

DB = 13  # a database of its own: the platform lease sets are shared by every test in db 0
LEASE_S = 600.0  # nothing expires by itself during a run: a rule says when a lease's time is up
limits = st.sampled_from([0, 1, 2, 4])  # 0: unlimited, as in the script


class Ask(NamedTuple):
    """One request's reservation, and the tokens it settles with (more or fewer)."""

    tokens: int
    pages: int
    batch: bool
    used: int
    user: str | None  # the end user it names, held to the team's limits per user
    model: str  # the model it was routed to: the team's and the key's limits on it hold it


USERS = st.sampled_from([None, "ann", "ann", "bo"])
MODELS = st.sampled_from(["big", "big", "small"])  # only "big" has limits of its own
ASK = st.builds(
    Ask, st.integers(1, 500), st.integers(0, 8), st.booleans(), st.integers(0, 600), USERS, MODELS
)


def scopes(user: str | None, model: str) -> list[tuple[str, str]]:
    """The buckets of its own a request is counted in, beside the team's and the key's."""
    return ([("user", user)] if user is not None else []) + [("model", model)]


def _over(limit: int, amount: int) -> bool:
    return limit > 0 and amount > limit


@dataclass
class Held:
    res: Reservation
    used: int
    dead: bool = False  # its gateway died: never renewed nor settled
    expired: bool = False  # its lease's time is up (not renewed in time)
    purged: bool = False  # a later reservation dropped the expired lease


class QuotaMachine(RuleBasedStateMachine):
    url = ""  # set by the test: the Redis server's URL

    def __init__(self) -> None:
        super().__init__()
        self.sync = redis.Redis.from_url(self.url, db=DB)
        self.sync.flushdb()
        self.loop = asyncio.new_event_loop()
        self.redis = aioredis.Redis.from_url(self.url, db=DB)
        self.held: dict[str, Held] = {}
        self.asked = 0  # reservations asked for: the lease ids
        self.admitted = 0  # reservations admitted (requests per minute)
        self.charged_minute = 0  # tokens charged to the per-minute bucket, refunds included
        self.charged_day = {False: 0, True: 0}  # per tier (batch has its own daily budget)
        self.admitted_in: dict[tuple[str, str], int] = {}  # the same two, per end user and model
        self.charged_in: dict[tuple[str, str], int] = {}
        self.started = time.monotonic()

    @initialize(
        rpm=st.sampled_from([0, 3, 8]),
        tpm=st.sampled_from([0, 300, 1000]),
        tpd=st.sampled_from([0, 400, 2000]),
        batch_tpd=st.sampled_from([0, 400]),
        concurrency=limits,
        kv_pages=st.sampled_from([0, 5, 20]),
        platform=limits,
        platform_batch=limits,
        key_rpm=st.sampled_from([0, 2, 8]),
        key_tpm=st.sampled_from([0, 250, 1000]),
        key_concurrency=limits,
        user_rpm=st.sampled_from([0, 2, 2, 5]),
        user_tpm=st.sampled_from([0, 300, 800]),
        model_rpm=st.sampled_from([0, 2, 5]),
        model_tpm=st.sampled_from([0, 300, 800]),
        shared_rpm=st.sampled_from([0, 1, 3]),  # every team's on "big" (the catalog's)
        shared_tpm=st.sampled_from([0, 300, 500]),
        key_model_rpm=st.sampled_from([0, 1, 4]),  # the key's own on "big"
        key_model_tpm=st.sampled_from([0, 200, 700]),
    )
    def limits(
        self,
        rpm: int,
        tpm: int,
        tpd: int,
        batch_tpd: int,
        concurrency: int,
        kv_pages: int,
        platform: int,
        platform_batch: int,
        key_rpm: int,
        key_tpm: int,
        key_concurrency: int,
        user_rpm: int,
        user_tpm: int,
        model_rpm: int,
        model_tpm: int,
        shared_rpm: int,
        shared_tpm: int,
        key_model_rpm: int,
        key_model_tpm: int,
    ) -> None:
        self.shared = {"big": (shared_rpm, shared_tpm)}
        self.policy = TeamPolicy(
            team="props",  # alone in its flushed database
            rpm=rpm,
            tpm=tpm,
            tokens_per_day=tpd,
            batch_tokens_per_day=batch_tpd,
            concurrency=concurrency,
            kv_pages=kv_pages,
            # the one key every request comes with: its own buckets beside the team's
            key_prefix="ty-props0000",
            key_rpm=key_rpm,
            key_tpm=key_tpm,
            key_concurrency=key_concurrency,
            user_rpm=user_rpm,
            user_tpm=user_tpm,
            model_limits={"big": (model_rpm, model_tpm)},
            key_model_limits={"big": (key_model_rpm, key_model_tpm)},
        )
        self.quotas = Quotas(
            self.redis,
            lease_s=LEASE_S,
            fail_open=False,
            max_concurrency=platform,
            max_batch_concurrency=platform_batch,
        )
        self.keys = self.quotas.team_keys(self.policy.team)
        self.key_leases = self.keys.key_leases(self.policy.key_prefix)

    # ------------------------------------------------------------ the model

    def live(self) -> list[Held]:
        """Leases Redis still holds (an expired one counts until a reservation purges it)."""
        return [h for h in self.held.values() if not h.purged]

    def running(self) -> list[str]:
        """Reservations whose gateway is alive: they are renewed and settled."""
        return sorted(i for i, h in self.held.items() if not h.dead)

    def day_limit(self, batch: bool) -> int:
        return self.policy.batch_tokens_per_day if batch else self.policy.tokens_per_day

    # ------------------------------------------------------------ the rules

    @rule(asks=st.lists(ASK, min_size=1, max_size=6))
    def reserve(self, asks: list[Ask]) -> None:
        """Requests arriving together: their calls share one pipeline, each still atomic."""
        first, self.asked = self.asked, self.asked + len(asks)
        leases = [f"lease-{n}" for n in range(first, self.asked)]  # replayable: no random ids

        async def together() -> list[Reservation | BaseException]:
            calls = [
                self.quotas.reserve(
                    self.policy,
                    lease_id,
                    ask.tokens,
                    ask.pages,
                    ask.batch,
                    ask.user,
                    ask.model,
                    self.shared.get(ask.model, (0, 0)),
                )
                for lease_id, ask in zip(leases, asks, strict=True)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

        results = self.loop.run_until_complete(together())
        for ask, result in zip(asks, results, strict=True):
            self.purge()  # the script purges expired leases before it decides, admitted or not
            if isinstance(result, GatewayError):
                self.check_refusal(result, ask)
                continue
            assert isinstance(result, Reservation), result
            self.held[result.lease_id] = Held(result, ask.used)
            self.admitted += 1
            self.charged_minute += ask.tokens
            self.charged_day[ask.batch] += ask.tokens
            for scope in scopes(ask.user, ask.model):
                self.admitted_in[scope] = self.admitted_in.get(scope, 0) + 1
                self.charged_in[scope] = self.charged_in.get(scope, 0) + ask.tokens
            self.check_admission(ask)

    def purge(self) -> None:
        for held in self.held.values():
            held.purged = held.purged or held.expired

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        self.settle_lease(data.draw(st.sampled_from(self.running())))

    def settle_lease(self, lease_id: str) -> None:
        held = self.held.pop(lease_id)
        usage = Usage(prompt_tokens=held.used)
        event = UsageEvent(request_id=lease_id, team="t", model="m", model_served="m", ts=0.0)
        self.loop.run_until_complete(self.quotas.settle(held.res, usage, event))
        delta = held.used - held.res.tokens
        self.charged_minute += delta
        self.charged_day[held.res.batch] += delta
        for scope in scopes(held.res.end_user, held.res.model):
            self.charged_in[scope] += delta

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def fail_over(self, data: st.DataObject) -> None:
        """A running request's upstream fails before its first byte: its reservation moves to the
        other model, or the limits there refuse it and it stays where it was."""
        held = self.held[data.draw(st.sampled_from(self.running()))]
        tokens, left = held.res.tokens, held.res.model
        to = "small" if left == "big" else "big"
        moved = self.quotas.move(held.res, to, self.shared.get(to, (0, 0)))
        refused = self.loop.run_until_complete(moved)
        if refused is not None:
            assert held.res.model == left
            assert self.model_limit_reached(to)[refused], f"moving refused for {refused}"
            return
        assert held.res.model == to
        self.admitted_in[("model", to)] = self.admitted_in.get(("model", to), 0) + 1
        self.charged_in[("model", to)] = self.charged_in.get(("model", to), 0) + tokens
        self.charged_in[("model", left)] -= tokens  # its request count stays there
        self.check_scope(("model", to), to)

    @rule()
    def renew(self) -> None:
        running = [self.held[i] for i in self.running()]
        self.loop.run_until_complete(self.quotas.renew([h.res for h in running]))
        for held in running:  # a lease not purged yet is extended again
            held.expired = held.expired and held.purged

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def gateway_dies(self, data: st.DataObject) -> None:
        self.held[data.draw(st.sampled_from(self.running()))].dead = True

    @precondition(lambda self: any(not h.expired for h in self.held.values()))
    @rule(data=st.data())
    def lease_expires(self, data: st.DataObject) -> None:
        """A lease's time is up: its gateway died, or stalled past the lease without renewing."""
        ids = sorted(i for i, h in self.held.items() if not h.expired)
        held = self.held[data.draw(st.sampled_from(ids))]
        self.expire(held)

    def expire(self, held: Held) -> None:
        # Redis's clock cannot be moved: the lease's expiry score is set in the past instead
        for key in self.lease_sets(held.res):
            self.sync.zadd(key, {held.res.lease_id: 0}, xx=True)
        held.expired = True

    def lease_sets(self, res: Reservation) -> list[str]:
        batch = [PLATFORM_BATCH_LEASES] if res.batch else []
        return [self.keys.leases, PLATFORM_LEASES, self.key_leases, *batch]

    # ------------------------------------------------------------ the properties

    def check_admission(self, ask: Ask) -> None:
        """Right after an admission, nothing is over its limit (the buckets also refill)."""
        policy, quotas, live, batch = self.policy, self.quotas, self.live(), ask.batch
        minutes = (time.monotonic() - self.started) / 60 + 0.001
        if policy.concurrency:
            assert len(live) <= policy.concurrency
        if policy.key_concurrency:
            assert len(live) <= policy.key_concurrency
        if policy.kv_pages:
            assert sum(h.res.pages for h in live) <= policy.kv_pages
        if self.day_limit(batch):
            assert self.charged_day[batch] <= self.day_limit(batch)
        if quotas.max_concurrency:
            assert len(live) <= quotas.max_concurrency
        if quotas.max_batch_concurrency:
            assert sum(h.res.batch for h in live) <= quotas.max_batch_concurrency
        if policy.rpm:
            assert self.admitted <= policy.rpm * (1 + minutes)
        if policy.tpm:
            assert self.charged_minute <= policy.tpm * (1 + minutes)
        if policy.key_rpm:
            assert self.admitted <= policy.key_rpm * (1 + minutes)
        if policy.key_tpm:
            assert self.charged_minute <= policy.key_tpm * (1 + minutes)
        # the admitted request's end user and model (settling more than was reserved may take
        # another over until its bucket refills; its next admission waits for that)
        for scope in scopes(ask.user, ask.model):
            self.check_scope(scope, ask.model)

    def check_scope(self, scope: tuple[str, str], model: str) -> None:
        """An end user's or a model's buckets hold no more than their limits let through."""
        policy, minutes = self.policy, (time.monotonic() - self.started) / 60 + 0.001
        limits = [(policy.user_rpm, policy.user_tpm)]
        if scope[0] == "model":  # the team's own on it, every team's (one team here), the key's
            limits = [policy.model_limit(model), self.shared.get(model, (0, 0))]
            limits.append(policy.key_model_limit(model))
        for rpm, tpm in limits:
            if rpm:
                assert self.admitted_in[scope] <= rpm * (1 + minutes), scope
            if tpm:
                assert self.charged_in[scope] <= tpm * (1 + minutes), scope

    def model_limit_reached(self, model: str) -> dict[str, bool]:
        """Which limits on `model` could refuse a request: those it has (buckets refill with
        Redis's clock, so any refusal of theirs is plausible)."""
        policy, shared = self.policy, self.shared.get(model, (0, 0))
        return {
            "model_requests_per_minute": policy.model_limit(model)[0] > 0,
            "model_tokens_per_minute": policy.model_limit(model)[1] > 0,
            "platform_model_requests_per_minute": shared[0] > 0,
            "platform_model_tokens_per_minute": shared[1] > 0,
            "key_model_requests_per_minute": policy.key_model_limit(model)[0] > 0,
            "key_model_tokens_per_minute": policy.key_model_limit(model)[1] > 0,
        }

    def check_refusal(self, refusal: GatewayError, ask: Ask) -> None:
        """A refusal names a limit that this request really would have passed."""
        tokens, pages, batch = ask.tokens, ask.pages, ask.batch
        live, code, policy, quotas = self.live(), refusal.code, self.policy, self.quotas
        held_batch = sum(h.res.batch for h in live)
        reached = {
            "concurrency": _over(policy.concurrency, len(live) + 1),
            "key_concurrency": _over(policy.key_concurrency, len(live) + 1),
            "kv_pages": _over(policy.kv_pages, sum(h.res.pages for h in live) + pages),
            "tokens_per_day": _over(policy.tokens_per_day, self.charged_day[False] + tokens),
            "batch_tokens_per_day": _over(
                policy.batch_tokens_per_day, self.charged_day[True] + tokens
            ),
            "platform_concurrency": _over(quotas.max_concurrency, len(live) + 1),
            "platform_batch_concurrency": batch
            and _over(quotas.max_batch_concurrency, held_batch + 1),
            # the buckets refill with Redis's clock: any refusal of theirs is plausible
            "requests_per_minute": policy.rpm > 0,
            "tokens_per_minute": policy.tpm > 0,
            "key_requests_per_minute": policy.key_rpm > 0,
            "key_tokens_per_minute": policy.key_tpm > 0,
            "user_requests_per_minute": ask.user is not None and policy.user_rpm > 0,
            "user_tokens_per_minute": ask.user is not None and policy.user_tpm > 0,
            **self.model_limit_reached(ask.model),
        }
        assert reached[code or ""], f"refused for {code} below the limit"

    @invariant()
    def redis_holds_what_the_model_holds(self) -> None:
        live = self.live()
        pages = int(self.sync.hget(self.keys.pages, "#sum") or 0)
        assert self.sync.zcard(self.keys.leases) == len(live)
        assert pages == sum(h.res.pages for h in live)
        assert self.sync.zcard(PLATFORM_LEASES) == len(live)
        # the key's own lease set is kept only while it has a concurrency of its own
        assert self.sync.zcard(self.key_leases) == (len(live) if self.policy.key_concurrency else 0)
        assert self.sync.zcard(PLATFORM_BATCH_LEASES) == sum(h.res.batch for h in live)
        for batch in (False, True):
            key = self.keys.day_batch_tokens if batch else self.keys.day_tokens
            assert int(self.sync.get(key(day_number())) or 0) == self.charged_day[batch]
        # what the batch tier asks before it takes spare capacity: a lease neither batch nor
        # past its time
        interactive = any(not h.res.batch and not h.expired for h in live)
        assert self.loop.run_until_complete(self.quotas.interactive_in_flight()) == interactive

    def teardown(self) -> None:
        """Everything settled or expired: every lease and KV page comes back."""
        try:
            if hasattr(self, "keys"):
                self.return_to_zero()
        finally:
            self.loop.run_until_complete(self.redis.aclose())
            self.loop.close()
            self.sync.close()

    def return_to_zero(self) -> None:
        for lease_id in self.running():
            self.settle_lease(lease_id)
        for held in self.held.values():
            if not held.expired:
                self.expire(held)
        # the next reservation purges what expired
        self.reserve([Ask(1, 0, False, 1, None, "small")])
        for lease_id in self.running():
            self.settle_lease(lease_id)
        for key in (self.keys.leases, PLATFORM_LEASES, PLATFORM_BATCH_LEASES, self.key_leases):
            assert self.sync.zcard(key) == 0, key
        assert int(self.sync.hget(self.keys.pages, "#sum") or 0) == 0


def test_quota_scripts_never_admit_past_a_limit_and_return_to_zero(
    redis_server: RedisServer,
) -> None:
    QuotaMachine.url = redis_server.url
    run_state_machine_as_test(
        QuotaMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_move_is_held_to_each_limit_on_the_model_it_goes_to(redis_server: RedisServer) -> None:
    """The fail-over's move, one limit at a time (the machine above meets each only by chance):
    spent by a request reserved there, each of the six limits on the new model refuses the move
    by name and the reservation stays put; without one it moves, and the model left gets back the
    tokens it had taken."""
    sync = redis.Redis.from_url(redis_server.url, db=DB)

    async def run() -> None:
        quotas = Quotas(
            aioredis.Redis.from_url(redis_server.url, db=DB), lease_s=60, fail_open=False
        )
        cases = [
            ("model_requests_per_minute", {"model_limits": {"big": (1, 0)}}, (0, 0)),
            ("model_tokens_per_minute", {"model_limits": {"big": (0, 150)}}, (0, 0)),
            ("platform_model_requests_per_minute", {}, (1, 0)),
            ("platform_model_tokens_per_minute", {}, (0, 150)),
            ("key_model_requests_per_minute", {"key_model_limits": {"big": (1, 0)}}, (0, 0)),
            ("key_model_tokens_per_minute", {"key_model_limits": {"big": (0, 150)}}, (0, 0)),
        ]
        for code, own, platform in cases:
            sync.flushdb()
            policy = TeamPolicy(team="moves", key_prefix="ty-moves0000", **own)
            await quotas.reserve(policy, "there", 100, 0, False, None, "big", platform)
            res = await quotas.reserve(policy, "here", 100, 0, False, None, "small")
            assert await quotas.move(res, "big", platform) == code
            assert res.model == "small"
        sync.flushdb()
        policy = TeamPolicy(team="moves", model_limits={"small": (0, 1000)})
        res = await quotas.reserve(policy, "here", 100, 0, False, None, "small")
        bucket = quotas.team_keys("moves").model_tpm("small")
        assert float(sync.hget(bucket, "level") or 0) == 900
        assert await quotas.move(res, "big", (0, 0)) is None
        assert res.model == "big" and float(sync.hget(bucket, "level") or 0) == 1000

    try:
        asyncio.run(run())
    finally:
        sync.flushdb()
        sync.close()
