"""Names and types of a team's settable limits, the tiers, and what a limit's value may be; import-
light for the CLI parser."""

import math
import re
from typing import Any

TIERS = ("interactive", "batch")

# Team fields a caller may set with create/update (the CLI's flags), with their types
LIMIT_FIELDS: dict[str, type] = {
    "rpm": int,
    "tpm": int,
    "tokens_per_day": int,
    "batch_tokens_per_day": int,
    "usd_per_day": float,
    "usd_per_month": float,
    "concurrency": int,
    "kv_pages": int,
    "max_tokens": int,
    "max_context": int,
    "models": str,
    "default_tier": str,
    "auto_threshold": float,
    "strong_share": float,
    "auto_quality": float,
    "cache_ttl_s": float,
    # each end user's own limits within the team (LiteLLM's customer budgets): the user a request
    # names in `safety_identifier` or `user`; requests that name none are held to the team's alone
    "user_rpm": int,
    "user_tpm": int,
    "user_usd_per_day": float,
    # where the team's own budget alerts go (billing/alerts.py), beside the operator's; set by the
    # operator (CLI, admin API, admin UI), never by the team's keys
    "alert_url": str,
    # where the team's events go (a background response or a batch ended; tenancy/events.py),
    # signed with its webhook secret; set by the operator likewise
    "webhook_url": str,
    # a model's own requests and tokens per minute for the team ({"gpt-4o": {"rpm": 100}}), beside
    # the team's overall ones: the scarce models rationed, the cheap ones left free
    "model_limits": dict,
    # the kinds of endpoint the team may call (SCOPES, comma-separated; unset: every kind), as
    # OpenAI's restricted keys: a search service's key that can only embed, say
    "scopes": str,
    # the tags every deployment that serves the team must carry (the catalog's `tags`: "eu",
    # "zero-retention"; comma-separated; unset: any deployment): data residency and the
    # providers' terms a team is bound to, kept by routing; models without such a deployment are
    # never its routes
    "deployment_tags": str,
}

# the limits a key may have of its own, beside its team's (a subset of the team's fields)
KEY_LIMIT_FIELDS = (
    "rpm",
    "tpm",
    "usd_per_day",
    "usd_per_month",
    "concurrency",
    "model_limits",
    "scopes",
)

# the kinds of endpoint a team or a key may be restricted to (gateway/scopes.py says which paths
# each covers); listing the models is open to every key
SCOPES = (
    "completions",
    "embeddings",
    "images",
    "audio",
    "moderations",
    "batch",
    "usage",
    "feedback",
)

# a deployment tag, in the catalog and a team's deployment_tags
TAG = re.compile(r"[a-z0-9][a-z0-9_.-]{0,39}")
MAX_TAGS = 16

# the fields that are receivers' URLs, set by the operator ('' clears one)
URL_FIELDS = ("alert_url", "webhook_url")

# the fields that are shares, in [0, 1]
FRACTIONS = ("auto_threshold", "strong_share", "auto_quality")

# a larger count is a typo, would overflow SQL's 64-bit integers (2**63 and up was a 500), and would
# not survive the quota script's float arithmetic (Lua numbers are doubles)
MAX_COUNT = 2**53
MAX_URL = 2048
MODEL_LIMITS = ("rpm", "tpm")  # what a model's own limits may hold
MAX_MODEL_ID = 200


def model_limits_problem(value: Any) -> str | None:
    """What is wrong with a team's per-model limits (a mapping of model id to {rpm, tpm})."""
    if not isinstance(value, dict):
        return 'must map model ids to limits, e.g. {"gpt-4o": {"rpm": 100, "tpm": 50000}}'
    for model, limits in value.items():
        if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_ID:
            return f"names models by ids of 1 to {MAX_MODEL_ID} characters"
        if not isinstance(limits, dict) or not limits or set(limits) - set(MODEL_LIMITS):
            return f"{model!r} must set rpm, tpm or both"
        for name, count in limits.items():
            if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_COUNT:
                return f"{model!r}: {name} must be a whole number from 1 to {MAX_COUNT}"
    return None


def parse_model_limits(text: str) -> dict[str, dict[str, int]]:
    """Per-model limits as people type them (the CLI's flag, the admin UI's field):
    "gpt-4o: rpm=100, tpm=50000; claude-sonnet-4: rpm=20" (";" or new lines between models).
    Raises ValueError saying what is wrong; "" is none."""
    parsed: dict[str, dict[str, int]] = {}
    for entry in filter(None, (e.strip() for e in text.replace("\n", ";").split(";"))):
        model, colon, rest = entry.rpartition(":")
        model = model.strip()
        if not colon or not model:
            raise ValueError(f"{entry!r} is not 'model: rpm=N, tpm=N'")
        limits = parsed.setdefault(model, {})
        for item in filter(None, (i.strip() for i in rest.split(","))):
            name, equals, count = (part.strip() for part in item.partition("="))
            if not equals or name not in MODEL_LIMITS or not (count.isascii() and count.isdigit()):
                raise ValueError(f"{model!r}: {item!r} is not rpm=N or tpm=N")
            limits[name] = int(count)
    if (error := model_limits_problem(parsed)) is not None:
        raise ValueError(error)
    return parsed


def model_limits_text(value: dict[str, dict[str, int]] | None) -> str:
    """The inverse of parse_model_limits, for a form showing a team's settings."""
    return "; ".join(
        f"{model}: " + ", ".join(f"{name}={count}" for name, count in limits.items())
        for model, limits in (value or {}).items()
    )


def _items(value: Any) -> set[str] | None:
    """A list as given (a list of strings, or "a, b"), its items stripped; None: not a list."""
    given = value.split(",") if isinstance(value, str) else (value or [])
    if not isinstance(given, list) or not all(isinstance(s, str) for s in given):
        return None
    return {s.strip() for s in given if s.strip()}


def scopes_text(value: str | list[str] | None) -> str | None:
    """Scopes as given (a list, or "completions, embeddings") as stored: each once, in SCOPES'
    order, comma-separated; None for none (every kind)."""
    wanted = _items(value) or set()
    return ",".join(s for s in SCOPES if s in wanted) or None


def scopes_problem(value: Any) -> str | None:
    given = _items(value)
    if given is None:
        return f"must list some of {', '.join(SCOPES)}"
    if unknown := sorted(given - set(SCOPES)):
        return f"names no scope {', '.join(unknown)}: the scopes are {', '.join(SCOPES)}"
    return None


def tags_text(value: str | list[str] | None) -> str | None:
    """Deployment tags as given, as stored: sorted, each once, comma-separated; None for none."""
    return ",".join(sorted(_items(value) or ())) or None


def tags_problem(value: Any) -> str | None:
    given = _items(value)
    if given is None:
        return "must list deployment tags, e.g. eu, zero-retention"
    if bad := sorted(t for t in given if not TAG.fullmatch(t)):
        rule = "lower-case letters, digits, '_', '.' or '-'"
        return f"has tags the catalog cannot name ({', '.join(bad)}): {rule}"
    if len(given) > MAX_TAGS:
        return f"lists more than {MAX_TAGS} tags"
    return None


def problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for the limit `name`, said for a person (None: nothing; None
    itself means unlimited). The one rule for the CLI, the admin API and the admin UI."""
    kind = LIMIT_FIELDS[name]
    if value is None or name == "models":
        return None
    if name in URL_FIELDS:
        from tokenyard.core import destinations  # httpx's parser: kept off the CLI's start

        if value == "":  # none
            return None
        if not isinstance(value, str) or len(value) > MAX_URL:
            return f"must be a URL of at most {MAX_URL} characters"
        try:
            destinations.spelled(value)
        except destinations.RefusedDestination as exc:
            return f"is refused: {exc}"
        return None
    if name == "model_limits":
        return model_limits_problem(value)
    if name == "scopes":
        return scopes_problem(value)
    if name == "deployment_tags":
        return tags_problem(value)
    if name == "default_tier":
        return None if value in TIERS else f"must be one of {', '.join(TIERS)}"
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        return "must be a whole number" if kind is int else "must be a number"
    if not math.isfinite(value) or value < 0:
        return "must be 0 or more"
    if name in FRACTIONS and value > 1:
        return "must be between 0 and 1"
    if value > MAX_COUNT:
        return f"must be at most {MAX_COUNT}"
    return None


# the CLI's help for each: what it limits, its unit, what unset means
LIMIT_HELP: dict[str, str] = {
    "rpm": "requests per minute (default: unlimited)",
    "tpm": "prompt + completion tokens per minute (default: unlimited)",
    "tokens_per_day": "tokens per UTC day (default: unlimited)",
    "batch_tokens_per_day": "tokens per UTC day on the batch tier (default: unlimited)",
    "usd_per_day": "US dollars of spend per UTC day, e.g. 25.00 (default: unlimited)",
    "usd_per_month": "US dollars of spend per calendar month (UTC), e.g. 500 (default: unlimited)",
    "concurrency": "requests in flight at once (default: unlimited)",
    "kv_pages": "KV-cache pages in flight on self-hosted models (default: unlimited)",
    "max_tokens": "cap on a request's max_tokens, in tokens (default: the platform's cap)",
    "max_context": "cap on prompt + max_tokens, in tokens (default: the model's window)",
    "models": "comma-separated model ids the team may use (default: every model)",
    "default_tier": "tier of requests that name none: interactive or batch (default: interactive)",
    "auto_threshold": "model=auto escalates prompts scoring at or above this, 0 to 1 "
    "(default: the catalog's)",
    "strong_share": "model=auto's share of traffic for the strong model when no threshold is "
    "set, 0 to 1 (default: the catalog's)",
    "auto_quality": "model=auto sends each prompt to the cheapest model whose predicted quality "
    "on it reaches this, 0 to 1; set, it wins over the threshold and share (default: the "
    "catalog's quality_bar)",
    "cache_ttl_s": "seconds the response cache keeps the team's deterministic answers; 0: never "
    "cached (default: the platform's TOKENYARD_GATEWAY_CACHE_TTL_S)",
    "user_rpm": "requests per minute of each end user (the request's safety_identifier or user) "
    "(default: unlimited)",
    "user_tpm": "tokens per minute of each end user (default: unlimited)",
    "user_usd_per_day": "US dollars of spend per UTC day of each end user (default: unlimited)",
    "alert_url": "where the team's own budget alerts are POSTed, signed with its webhook secret "
    "('' on update: none)",
    "webhook_url": "where the team's events (a background response or a batch ended, as OpenAI's "
    "webhook events) are POSTed, signed with its webhook secret ('' on update: none)",
    "model_limits": "requests and tokens per minute of single models, beside the team's, e.g. "
    "'gpt-4o: rpm=100, tpm=50000; claude-sonnet-4: rpm=20' (replaces the team's; '' on update: "
    "none)",
    "scopes": f"comma-separated kinds of endpoint that may be called, of {', '.join(SCOPES)} "
    "(default: every kind; '' on update: every kind)",
    "deployment_tags": "comma-separated tags every deployment serving the team must carry, e.g. "
    "'eu' (the catalog's tags; default: any deployment; '' on update: any)",
}
