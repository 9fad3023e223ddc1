"""OpenAI's x-ratelimit-* headers (requests and tokens per minute: limit, remaining, reset), from
the levels of the per-minute buckets that the reserve script returns with its verdict: no Redis
call of their own. Sent only for the limits a team has."""


def duration(seconds: float) -> str:
    """OpenAI's way of writing a wait: 20ms, 6s, 1m30s."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, whole = divmod(round(seconds), 60)
    return f"{minutes}m{whole}s" if minutes else f"{whole}s"


def rate_limit_headers(rpm: int, rpm_level: int, tpm: int, tpm_level: int) -> dict[str, str]:
    """A bucket's level is what is left of its limit; it refills limit/minute, so it is full again
    (reset) after (limit - level) / limit minutes. A level below 0: the bucket is not kept."""
    headers = {}
    for kind, limit, level in (("requests", rpm, rpm_level), ("tokens", tpm, tpm_level)):
        if limit > 0 and level >= 0:
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(level)
            headers[f"x-ratelimit-reset-{kind}"] = duration((limit - level) * 60 / limit)
    return headers
