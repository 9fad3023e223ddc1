"""Names and types of a team's settable limits, and the tiers; import-light for the CLI parser."""

TIERS = ("interactive", "batch")

# Team fields a caller may set with create/update (the CLI's flags), with their types
LIMIT_FIELDS: dict[str, type] = {
    "rpm": int,
    "tpm": int,
    "tokens_per_day": int,
    "batch_tokens_per_day": int,
    "usd_per_day": float,
    "concurrency": int,
    "kv_pages": int,
    "max_tokens": int,
    "max_context": int,
    "models": str,
    "default_tier": str,
    "auto_threshold": float,
    "strong_share": float,
    "auto_quality": float,
}

# the fields that are shares, in [0, 1]
FRACTIONS = ("auto_threshold", "strong_share", "auto_quality")

# the CLI's help for each: what it limits, its unit, what unset means
LIMIT_HELP: dict[str, str] = {
    "rpm": "requests per minute (default: unlimited)",
    "tpm": "prompt + completion tokens per minute (default: unlimited)",
    "tokens_per_day": "tokens per UTC day (default: unlimited)",
    "batch_tokens_per_day": "tokens per UTC day on the batch tier (default: unlimited)",
    "usd_per_day": "US dollars of spend per UTC day, e.g. 25.00 (default: unlimited)",
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
}
