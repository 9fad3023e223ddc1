"""Per-team, per-key, per-end-user and platform quotas, enforced by one Lua script call per request
(quotas.lua).

reserve() takes everything a request may use (a request, prompt + max_tokens tokens, a concurrency
lease, KV pages) or nothing; settle() swaps the reservation for the actual usage, releases the
leases and appends the usage event; a LeaseKeeper renews the leases of running requests so that
only a dead gateway's leases expire.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenyard.core.errors import GatewayError
from tokenyard.core.tasks import cancel_and_wait
from tokenyard.core.usage import USAGE_STREAM, Usage, UsageEvent
from tokenyard.gateway.ratelimit_headers import rate_limit_headers
from tokenyard.gateway.scripts import BatchedScript
from tokenyard.gateway.spool import UsageSpool
from tokenyard.gateway.tracing import NO_TRACE, RequestTrace
from tokenyard.tenancy.policy import TeamPolicy

log = logging.getLogger("tokenyard.gateway")

_SCRIPT = (Path(__file__).parent / "quotas.lua").read_text()
_PLATFORM_CODES = {
    "platform_concurrency",
    "platform_batch_concurrency",
    "platform_model_requests_per_minute",
    "platform_model_tokens_per_minute",
}
_MESSAGES = {
    "requests_per_minute": "requests per minute",
    "tokens_per_minute": "tokens per minute",
    "tokens_per_day": "tokens per day",
    "batch_tokens_per_day": "batch tokens per day",
    "usd_per_day": "dollars per day",
    "usd_per_month": "dollars per month",
    "concurrency": "concurrent requests",
    "kv_pages": "KV-cache pages in flight",
    "platform_concurrency": "platform requests in flight",
    "platform_batch_concurrency": "platform batch requests in flight",
    # a key's own limits, beside its team's
    "key_requests_per_minute": "requests per minute",
    "key_tokens_per_minute": "tokens per minute",
    "key_usd_per_day": "dollars per day",
    "key_usd_per_month": "dollars per month",
    "key_concurrency": "concurrent requests",
    # each end user's, within its team
    "user_requests_per_minute": "requests per minute",
    "user_tokens_per_minute": "tokens per minute",
    "user_usd_per_day": "dollars per day",
    # the team's own on the model it was routed to
    "model_requests_per_minute": "requests per minute",
    "model_tokens_per_minute": "tokens per minute",
    # every team's together on it (the catalog's rpm and tpm of the model)
    "platform_model_requests_per_minute": "requests per minute",
    "platform_model_tokens_per_minute": "tokens per minute",
    # the key's own on it
    "key_model_requests_per_minute": "requests per minute",
    "key_model_tokens_per_minute": "tokens per minute",
}
# limits of the model a request was routed to (the team's own on it, every team's, or the key's
# own): another candidate may take it
MODEL_LIMIT_CODES = frozenset(
    {
        "model_requests_per_minute",
        "model_tokens_per_minute",
        "platform_model_requests_per_minute",
        "platform_model_tokens_per_minute",
        "key_model_requests_per_minute",
        "key_model_tokens_per_minute",
    }
)
_BUDGET_CODES = {
    "usd_per_day",
    "usd_per_month",
    "key_usd_per_day",
    "key_usd_per_month",
    "user_usd_per_day",
}


_EPOCH = date(1970, 1, 1).toordinal()


def day_number(when: date | None = None) -> int:
    """Days since the epoch (UTC): the suffix of daily keys."""
    if when is None:
        return int(time.time() // 86400)
    return (when - date(1970, 1, 1)).days


def month_of(when: datetime | None = None) -> tuple[str, int]:
    """The UTC calendar month ("2026-11": the suffix of monthly keys) and when it ends (unix
    seconds: a spent monthly budget's Retry-After)."""
    now = datetime.now(UTC) if when is None else when
    following = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    return f"{now:%Y-%m}", int(following.timestamp())


class TeamKeys:
    """Redis key names of one team; the {team} hash tag keeps them in one Cluster slot."""

    def __init__(self, team: str) -> None:
        base = f"ty:{{{team}}}"
        self.rpm = f"{base}:rpm"
        self.tpm = f"{base}:tpm"
        self.leases = f"{base}:leases"
        self.pages = f"{base}:pages"
        self.base = base

    def day_tokens(self, day: int) -> str:
        return f"{self.base}:tokens:{day}"

    def day_batch_tokens(self, day: int) -> str:
        return f"{self.base}:batch-tokens:{day}"

    def day_usd(self, day: int) -> str:
        return f"{self.base}:usd:{day}"

    def month_usd(self, month: str) -> str:
        return f"{self.base}:usd-month:{month}"

    def key_rpm(self, prefix: str) -> str:
        """A key's own counters carry its team's tag: one script still touches one slot."""
        return f"{self.base}:key:{prefix}:rpm"

    def key_tpm(self, prefix: str) -> str:
        return f"{self.base}:key:{prefix}:tpm"

    def key_day_usd(self, prefix: str, day: int) -> str:
        return f"{self.base}:key:{prefix}:usd:{day}"

    def key_month_usd(self, prefix: str, month: str) -> str:
        return f"{self.base}:key:{prefix}:usd-month:{month}"

    def key_leases(self, prefix: str) -> str:
        return f"{self.base}:key:{prefix}:leases"

    def user_rpm(self, user: str) -> str:
        """An end user's counters, under its team's tag too. Its name is the client's string (at
        most 128 characters): the fixed suffixes keep two users' keys apart whatever they hold."""
        return f"{self.base}:user:{user}:rpm"

    def user_tpm(self, user: str) -> str:
        return f"{self.base}:user:{user}:tpm"

    def user_day_usd(self, user: str, day: int) -> str:
        return f"{self.base}:user:{user}:usd:{day}"

    def model_rpm(self, model: str) -> str:
        """The team's buckets on one model (its id, from the catalog, after a fixed part)."""
        return f"{self.base}:model:{model}:rpm"

    def model_tpm(self, model: str) -> str:
        return f"{self.base}:model:{model}:tpm"

    def key_model_rpm(self, prefix: str, model: str) -> str:
        """A key's own buckets on one model."""
        return f"{self.base}:key:{prefix}:model:{model}:rpm"

    def key_model_tpm(self, prefix: str, model: str) -> str:
        return f"{self.base}:key:{prefix}:model:{model}:tpm"


@dataclass(frozen=True)
class DayUse:
    """What this UTC day has used of a team's daily budgets, and this month of its monthly one, as
    the quota counters hold it."""

    tokens: int
    batch_tokens: int
    usd: float
    usd_month: float


def _usd(micro_usd: bytes | str | None) -> float:
    """Spend is counted in whole micro-dollars (INCRBYFLOAT keeps it a float string)."""
    return int(float(micro_usd or 0)) / 1e6


PLATFORM_LEASES = "ty:platform:leases"
PLATFORM_BATCH_LEASES = "ty:platform:batch-leases"


def platform_model_rpm(model: str) -> str:
    """Every team's buckets on one model (the catalog's limits of it)."""
    return f"ty:platform:model:{model}:rpm"


def platform_model_tpm(model: str) -> str:
    return f"ty:platform:model:{model}:tpm"


@dataclass
class Reservation:
    lease_id: str
    policy: TeamPolicy
    keys: TeamKeys
    day: int
    month: str
    tokens: int
    pages: int
    batch: bool
    end_user: str | None = None  # held to the team's limits per end user, where it names one
    model: str = ""  # the model it was routed to: the team's limits on that model hold it
    platform_tpm: int = 0  # every team's tokens per minute on that model (0: none)
    enforced: bool = True  # False: admitted without Redis (fail-open), nothing to settle
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-*, as reserve left them
    trace: RequestTrace = NO_TRACE  # the request's spans; its settling ends them

    @property
    def day_key(self) -> str:
        """The daily token counter: the batch tier has its own budget, apart from interactive."""
        keys = self.keys
        return keys.day_batch_tokens(self.day) if self.batch else keys.day_tokens(self.day)

    @property
    def user(self) -> str:
        return self.end_user or ""

    def user_limit(self, limit: float) -> float:
        """The team's limit per end user as it applies to this request: none without an end user."""
        return limit if self.end_user is not None else 0


def _tightest(*buckets: tuple[int, int]) -> tuple[int, int]:
    """Of (limit, level) pairs, the bucket with least left among those the script checked (a
    level of -1: not checked); (0, -1) where none was."""
    checked = [(limit, level) for limit, level in buckets if limit > 0 and level >= 0]
    return min(checked, key=lambda bucket: bucket[1], default=(0, -1))


def _headers(policy: TeamPolicy, model: str, levels: list[int]) -> dict[str, str]:
    """x-ratelimit-* for the bucket of each kind that runs out first: the team's, the key's own,
    the end user's, or the team's or the key's on the model. `levels`: team rpm, team tpm, key rpm,
    key tpm, user rpm, user tpm, model rpm, model tpm, key model rpm, key model tpm."""
    limits = [policy.rpm, policy.tpm, policy.key_rpm, policy.key_tpm, policy.user_rpm]
    limits += [policy.user_tpm, *policy.model_limit(model), *policy.key_model_limit(model)]
    rpm = _tightest(*zip(limits[0::2], levels[0::2], strict=True))
    tpm = _tightest(*zip(limits[1::2], levels[1::2], strict=True))
    return rate_limit_headers(rpm[0], rpm[1], tpm[0], tpm[1])


class Quotas:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        lease_s: float,
        fail_open: bool,
        max_concurrency: int = 0,
        max_batch_concurrency: int = 0,
        spool: UsageSpool | None = None,
        alert_at: str = "",
    ) -> None:
        self.redis = redis
        self.alert_at = alert_at  # percents of dollar budgets whose crossing settle reports
        self.spool = spool  # where usage events go when Redis cannot take them
        self.lease_ms = int(lease_s * 1000)
        self.fail_open = fail_open
        self.max_concurrency = max_concurrency
        self.max_batch_concurrency = max_batch_concurrency
        self._script = BatchedScript(redis, _SCRIPT)
        self._keys_by_team: dict[str, TeamKeys] = {}

    def team_keys(self, team: str) -> TeamKeys:
        keys = self._keys_by_team.get(team)
        if keys is None:
            keys = self._keys_by_team[team] = TeamKeys(team)
        return keys

    async def reserve(
        self,
        policy: TeamPolicy,
        lease_id: str,
        tokens: int,
        pages: int,
        batch: bool,
        end_user: str | None = None,
        model: str = "",
        platform: tuple[int, int] = (0, 0),
    ) -> Reservation:
        """Reserve for a request routed to `model` (its id in the catalog), or refuse it;
        `platform`: the model's requests and tokens per minute for every team together."""
        keys = self.team_keys(policy.team)
        day, (month, month_end) = day_number(), month_of()
        res = Reservation(lease_id, policy, keys, day, month, tokens, pages, batch, end_user, model)
        res.platform_tpm = platform[1]
        try:
            result = await self._script(
                keys=[
                    keys.rpm,
                    keys.tpm,
                    res.day_key,
                    keys.day_usd(day),
                    keys.leases,
                    keys.pages,
                    PLATFORM_LEASES,
                    PLATFORM_BATCH_LEASES,
                    keys.key_rpm(policy.key_prefix),
                    keys.key_tpm(policy.key_prefix),
                    keys.key_day_usd(policy.key_prefix, day),
                    keys.key_leases(policy.key_prefix),
                    keys.user_rpm(res.user),
                    keys.user_tpm(res.user),
                    keys.user_day_usd(res.user, day),
                    keys.month_usd(month),
                    keys.key_month_usd(policy.key_prefix, month),
                    keys.model_rpm(model),
                    keys.model_tpm(model),
                    platform_model_rpm(model),
                    platform_model_tpm(model),
                    keys.key_model_rpm(policy.key_prefix, model),
                    keys.key_model_tpm(policy.key_prefix, model),
                ],
                args=[
                    "reserve",
                    lease_id,
                    policy.rpm,
                    policy.tpm,
                    policy.batch_tokens_per_day if batch else policy.tokens_per_day,
                    int(policy.usd_per_day * 1_000_000),
                    policy.concurrency,
                    policy.kv_pages,
                    self.max_concurrency,
                    self.max_batch_concurrency,
                    tokens,
                    pages,
                    self.lease_ms,
                    1 if batch else 0,
                    policy.key_rpm,
                    policy.key_tpm,
                    int(policy.key_usd_per_day * 1_000_000),
                    policy.key_concurrency,
                    res.user_limit(policy.user_rpm),
                    res.user_limit(policy.user_tpm),
                    int(res.user_limit(policy.user_usd_per_day) * 1_000_000),
                    int(policy.usd_per_month * 1_000_000),
                    int(policy.key_usd_per_month * 1_000_000),
                    month_end,
                    *policy.model_limit(model),
                    *platform,
                    *policy.key_model_limit(model),
                ],
            )
        except RedisError as exc:
            self._admit_without(exc)
            res.enforced = False
            return res
        if result[0] == 1:
            res.headers = _headers(policy, model, result[1:11])
            return res
        code = result[1].decode() if isinstance(result[1], bytes) else result[1]
        levels = _headers(policy, model, result[3:13])
        if code == "tokens_per_day" and batch:
            code = "batch_tokens_per_day"
        retry_after = int(result[2])
        what = _MESSAGES[code]
        if code in _PLATFORM_CODES:
            on = f" on model {model!r}" if code.startswith("platform_model_") else ""
            raise GatewayError(
                503,
                f"the platform is at its limit of {what}{on}",
                code=code,
                retry_after=retry_after,
                limit=code,
                headers=levels,
            )
        if code.startswith("key_model_"):
            who = f"key {policy.key_prefix}… on model {model!r}"
        elif code.startswith("key_"):
            who = f"key {policy.key_prefix}…"
        elif code.startswith("user_"):
            who = f"end user {end_user!r} of team {policy.team!r}"
        elif code.startswith("model_"):
            who = f"team {policy.team!r} on model {model!r}"
        else:
            who = f"team {policy.team!r}"
        message = (
            f"{who} is over its limit of {what} "
            f"(this request needs {tokens} tokens, {pages} KV pages)"
        )
        # a spent budget: OpenAI's code, on which clients stop retrying
        if code in _BUDGET_CODES:
            raise GatewayError(
                429,
                f"{message}: {code}",
                code="insufficient_quota",
                retry_after=retry_after,
                kind="insufficient_quota",
                limit=code,
                headers=levels,
            )
        raise GatewayError(
            429, message, code=code, retry_after=retry_after, limit=code, headers=levels
        )

    def _admit_without(self, exc: RedisError) -> None:
        """Redis did not answer: go on without quotas where the deployment fails open, else 503."""
        if not self.fail_open:
            raise GatewayError(
                503,
                "quota store unavailable; retry shortly",
                code="quota_store_unavailable",
                retry_after=1,
            ) from None
        log.warning("quota store unreachable, admitting without quotas: %s", exc)

    async def move(self, res: Reservation, model: str, platform: tuple[int, int]) -> str | None:
        """Hand a reservation to another model, the request's upstream having failed before its
        first byte: the team's, every team's (`platform`) and the key's limits on `model` must hold
        it as they would a reservation made there, and the model it leaves gets its tokens back (a
        request was made there: that count stays). None where it moved, else the code of the limit
        on `model` that refused it."""
        if not res.enforced:  # admitted without Redis: nothing reserved to move
            return None
        keys, policy, prefix = res.keys, res.policy, res.policy.key_prefix
        try:
            result = await self._script(
                keys=[
                    keys.model_rpm(model),
                    keys.model_tpm(model),
                    platform_model_rpm(model),
                    platform_model_tpm(model),
                    keys.key_model_rpm(prefix, model),
                    keys.key_model_tpm(prefix, model),
                    keys.model_tpm(res.model),
                    platform_model_tpm(res.model),
                    keys.key_model_tpm(prefix, res.model),
                ],
                args=[
                    "move",
                    res.tokens,
                    *policy.model_limit(model),
                    *platform,
                    *policy.key_model_limit(model),
                    policy.model_limit(res.model)[1],
                    res.platform_tpm,
                    policy.key_model_limit(res.model)[1],
                ],
            )
        except RedisError as exc:
            self._admit_without(exc)
            return None  # the tokens stay on the first model's buckets, which settling refunds
        if result[0] != 1:
            code = result[1]
            return code.decode() if isinstance(code, bytes) else code
        res.model, res.platform_tpm = model, platform[1]
        return None

    async def settle(
        self, res: Reservation, usage: Usage, event: UsageEvent, spend_usd: float = 0.0
    ) -> None:
        """Replace the reservation with actual usage and charge `spend_usd` to the team's, the key's
        and the end user's dollars for the day (and the team's and key's for the month) it reserved
        on, where each has a budget (the next reservation checks it); never raises (leases expire
        regardless). The usage event is spooled locally when Redis cannot take it, so billing
        still gets it."""
        encoded = msgspec.json.encode(event)
        if not res.enforced:  # served fail-open without Redis
            self._spool(encoded)
            return
        keys, policy = res.keys, res.policy
        used = usage.prompt_tokens + usage.completion_tokens
        spend = round(spend_usd * 1_000_000)  # micro-dollars, for budgeted teams and keys
        try:
            await self._script(
                keys=[
                    keys.tpm,
                    res.day_key,
                    keys.leases,
                    keys.pages,
                    PLATFORM_LEASES,
                    PLATFORM_BATCH_LEASES,
                    USAGE_STREAM,
                    keys.day_usd(res.day),
                    keys.key_tpm(policy.key_prefix),
                    keys.key_day_usd(policy.key_prefix, res.day),
                    keys.key_leases(policy.key_prefix),
                    keys.user_tpm(res.user),
                    keys.user_day_usd(res.user, res.day),
                    keys.month_usd(res.month),
                    keys.key_month_usd(policy.key_prefix, res.month),
                    keys.model_tpm(res.model),
                    platform_model_tpm(res.model),
                    keys.key_model_tpm(policy.key_prefix, res.model),
                ],
                args=[
                    "settle",
                    res.lease_id,
                    res.tokens,
                    used,
                    policy.tpm,
                    encoded,
                    spend if policy.usd_per_day > 0 else 0,
                    policy.key_tpm,
                    spend if policy.key_usd_per_day > 0 else 0,
                    res.user_limit(policy.user_tpm),
                    spend if res.user_limit(policy.user_usd_per_day) > 0 else 0,
                    spend if policy.usd_per_month > 0 else 0,
                    spend if policy.key_usd_per_month > 0 else 0,
                    self.alert_at,
                    int(policy.usd_per_day * 1_000_000),
                    int(policy.usd_per_month * 1_000_000),
                    int(policy.key_usd_per_day * 1_000_000),
                    int(policy.key_usd_per_month * 1_000_000),
                    date.fromordinal(_EPOCH + res.day).isoformat(),
                    res.month,
                    policy.model_limit(res.model)[1],
                    res.platform_tpm,
                    policy.key_model_limit(res.model)[1],
                ],
            )
        except RedisError as exc:
            log.warning("could not settle %s (its leases will expire): %s", res.lease_id, exc)
            self._spool(encoded)

    def _spool(self, event: bytes) -> None:
        if self.spool is None:
            log.error("usage event lost: Redis unavailable and no spool configured")
            return
        try:
            self.spool.add(event)
        except OSError as exc:
            log.error("usage event lost: Redis unavailable and the spool failed: %s", exc)

    async def used_today(self, team: str) -> DayUse:
        names, day, (month, _) = self.team_keys(team), day_number(), month_of()
        tokens, batch, micro_usd, month_usd = await self.redis.mget(
            names.day_tokens(day),
            names.day_batch_tokens(day),
            names.day_usd(day),
            names.month_usd(month),
        )
        return DayUse(int(tokens or 0), int(batch or 0), _usd(micro_usd), _usd(month_usd))

    async def key_spent(self, team: str, prefix: str) -> tuple[float, float]:
        """What a key has spent this UTC day and this month (each counted only while the key has
        a budget of its own for it)."""
        names, (month, _) = self.team_keys(team), month_of()
        day, month_usd = await self.redis.mget(
            names.key_day_usd(prefix, day_number()), names.key_month_usd(prefix, month)
        )
        return _usd(day), _usd(month_usd)

    async def interactive_in_flight(self) -> bool:
        """Whether any gateway of the platform holds a live lease of an interactive request now
        (raises RedisError while Redis does not answer)."""
        now_ms = time.time() * 1000
        # one transaction: a lease settled between two separate counts would look like an
        # interactive request
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zcount(PLATFORM_LEASES, now_ms, "+inf")
            pipe.zcount(PLATFORM_BATCH_LEASES, now_ms, "+inf")
            every, batch = await pipe.execute()
        return every > batch

    async def renew(self, reservations: list[Reservation]) -> None:
        keys: list[str] = []
        ids: list[str] = []
        for res in reservations:
            if not res.enforced:
                continue
            keys += [res.keys.leases, PLATFORM_LEASES]
            ids += [res.lease_id, res.lease_id]
            if res.policy.key_concurrency > 0:
                keys.append(res.keys.key_leases(res.policy.key_prefix))
                ids.append(res.lease_id)
            if res.batch:
                keys.append(PLATFORM_BATCH_LEASES)
                ids.append(res.lease_id)
        if keys:
            await self._script(keys=keys, args=["renew", self.lease_ms, *ids])


class LeaseKeeper:
    """Renews every running request's leases in one script call per period (lease / 3)."""

    def __init__(self, quotas: Quotas, lease_s: float) -> None:
        self.quotas = quotas
        self.period = lease_s / 3
        self.active: dict[str, Reservation] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                await self.quotas.renew(list(self.active.values()))
            except RedisError as exc:
                log.warning("lease renewal failed: %s", exc)
