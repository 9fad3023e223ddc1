"""What the request path knows of a key and its team: their limits and the team's routing
settings, from their rows."""

from collections.abc import Iterable

import msgspec

from tokenyard.tenancy.models import ApiKey, Team

# an allowed-models (or scopes) list that matches none: empty would mean every one
NO_MODEL = ""


class TeamPolicy(msgspec.Struct, frozen=True):
    """What the request path needs to know about a key's team; cached, so small and immutable."""

    team: str
    rpm: int = 0  # 0: unlimited (the Lua script's convention)
    tpm: int = 0
    tokens_per_day: int = 0
    batch_tokens_per_day: int = 0  # the batch tier's own daily budget, instead of tokens_per_day
    usd_per_day: float = 0.0
    usd_per_month: float = 0.0
    concurrency: int = 0
    kv_pages: int = 0
    max_tokens: int = 0
    max_context: int = 0
    models: tuple[str, ...] = ()
    default_tier: str = "interactive"
    auto_threshold: float | None = None
    strong_share: float | None = None
    auto_quality: float | None = None
    cache_ttl_s: float | None = None  # None: the platform's response-cache time
    # the key's own limits, enforced beside the team's (0: none); its prefix names its counters
    key_prefix: str = ""
    key_rpm: int = 0
    key_tpm: int = 0
    key_usd_per_day: float = 0.0
    key_usd_per_month: float = 0.0
    key_concurrency: int = 0
    # each end user's own limits within the team (0: none)
    user_rpm: int = 0
    user_tpm: int = 0
    user_usd_per_day: float = 0.0
    blocked_users: frozenset[str] = frozenset()  # end users the team refuses
    # single models' own (rpm, tpm) for the team, beside its overall ones, and for the key, beside
    # the team's (0: none)
    model_limits: dict[str, tuple[int, int]] = {}
    key_model_limits: dict[str, tuple[int, int]] = {}
    scopes: tuple[str, ...] = ()  # the kinds of endpoint the key may call (): every kind
    # the tags every deployment serving the team must carry (): any deployment
    deployment_tags: frozenset[str] = frozenset()

    def allows(self, scope: str | None) -> bool:
        """Whether the key may call an endpoint of `scope` (None: one open to every key)."""
        return scope is None or not self.scopes or scope in self.scopes

    def model_limit(self, model: str) -> tuple[int, int]:
        """The team's own requests and tokens per minute on `model` (0: none)."""
        return self.model_limits.get(model, (0, 0))

    def key_model_limit(self, model: str) -> tuple[int, int]:
        """The key's own requests and tokens per minute on `model` (0: none)."""
        return self.key_model_limits.get(model, (0, 0))


def policy_of(team: Team, key: ApiKey | None = None, blocked: Iterable[str] = ()) -> TeamPolicy:
    """The team's policy as a key of it sees it: a key that names models (or scopes) narrows the
    team's list to those (to none, where the two share none); its own limits come along, and the
    end users the team blocks."""
    models = _within(model_list(team.models), model_list(key.models) if key else ())
    scopes = _within(model_list(team.scopes or ""), model_list(key.scopes or "") if key else ())
    return TeamPolicy(
        team=team.name,
        rpm=team.rpm or 0,
        tpm=team.tpm or 0,
        tokens_per_day=team.tokens_per_day or 0,
        batch_tokens_per_day=team.batch_tokens_per_day or 0,
        usd_per_day=team.usd_per_day or 0.0,
        usd_per_month=team.usd_per_month or 0.0,
        concurrency=team.concurrency or 0,
        kv_pages=team.kv_pages or 0,
        max_tokens=team.max_tokens or 0,
        max_context=team.max_context or 0,
        models=models,
        default_tier=team.default_tier,
        auto_threshold=team.auto_threshold,
        strong_share=team.strong_share,
        auto_quality=team.auto_quality,
        cache_ttl_s=team.cache_ttl_s,
        key_prefix=key.prefix if key else "",
        key_rpm=(key.rpm or 0) if key else 0,
        key_tpm=(key.tpm or 0) if key else 0,
        key_usd_per_day=(key.usd_per_day or 0.0) if key else 0.0,
        key_usd_per_month=(key.usd_per_month or 0.0) if key else 0.0,
        key_concurrency=(key.concurrency or 0) if key else 0,
        user_rpm=team.user_rpm or 0,
        user_tpm=team.user_tpm or 0,
        user_usd_per_day=team.user_usd_per_day or 0.0,
        blocked_users=frozenset(blocked),
        model_limits=_pairs(team.model_limits),
        key_model_limits=_pairs(key.model_limits) if key else {},
        scopes=scopes,
        deployment_tags=frozenset(model_list(team.deployment_tags or "")),
    )


def _within(team: tuple[str, ...], key: tuple[str, ...]) -> tuple[str, ...]:
    """A team's list (empty: every one) narrowed by its key's: those in both, in the key's order;
    (NO_MODEL,) where they share none."""
    if not key:
        return team
    return tuple(k for k in key if not team or k in team) or (NO_MODEL,)


def _pairs(limits: dict[str, dict[str, int]] | None) -> dict[str, tuple[int, int]]:
    """Stored per-model limits as (rpm, tpm) by model."""
    return {model: (own.get("rpm", 0), own.get("tpm", 0)) for model, own in (limits or {}).items()}


def model_list(models: str) -> tuple[str, ...]:
    """A stored comma-separated list (a team's or a key's model ids, or scopes) as a tuple."""
    return tuple(m for m in models.split(",") if m)
