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
}
