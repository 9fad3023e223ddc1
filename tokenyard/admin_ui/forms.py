"""The team form: every quota the gateway enforces, validated with a message per field; and a
key's own limits.

Blank means unlimited (None) for limits, "all models" for the allowed models, and the catalog
default for the auto-routing fields.
"""

from dataclasses import dataclass, field
from typing import Any

from tokenyard.tenancy.limits import (
    KEY_LIMIT_FIELDS,
    LIMIT_FIELDS,
    SCOPES,
    TIERS,
    model_limits_text,
    parse_model_limits,
    problem,
)
from tokenyard.tenancy.models import Team
from tokenyard.tenancy.teams import TEAM_NAME, TEAM_NAME_RULE

# field → (label, hint); the form shows LIMIT_FIELDS in their order, so a field added there shows up
# here too (under its own name until it gets a label)
LABELS: dict[str, tuple[str, str]] = {
    "rpm": ("Requests per minute", "whole number; blank: unlimited"),
    "tpm": ("Tokens per minute", "prompt + completion; blank: unlimited"),
    "tokens_per_day": ("Tokens per day", "UTC day; blank: unlimited"),
    "batch_tokens_per_day": ("Batch tokens per day", "batch tier, UTC day; blank: unlimited"),
    "usd_per_day": ("Dollars per day", "e.g. 25.00; blank: unlimited"),
    "usd_per_month": ("Dollars per month", "calendar month (UTC), e.g. 500; blank: unlimited"),
    "concurrency": ("Concurrent requests", "blank: unlimited"),
    "kv_pages": ("KV-cache pages in flight", "self-hosted models; blank: unlimited"),
    "max_tokens": ("Max tokens per request", "caps max_tokens; blank: the platform's cap"),
    "max_context": ("Max context per request", "prompt + max_tokens; blank: the model's"),
    "models": ("Allowed models", "none ticked: every model"),
    "default_tier": ("Default tier", "when a request names none"),
    "auto_threshold": ("Auto-routing threshold", "0 to 1: escalate prompts scoring this or more"),
    "strong_share": ("Strong-model share", "0 to 1: used when no threshold is set"),
    "auto_quality": ("Auto-routing quality bar", "0 to 1: cheapest model predicted to reach it"),
    "cache_ttl_s": ("Response cache, seconds", "0: off; blank: the platform's time"),
    "user_rpm": ("Requests per minute, each end user", "by safety_identifier or user; blank: none"),
    "user_tpm": ("Tokens per minute, each end user", "blank: none"),
    "user_usd_per_day": ("Dollars per day, each end user", "UTC day; blank: none"),
    "alert_url": ("Budget alerts URL", "the team's own receiver (Slack works); blank: none"),
    "webhook_url": (
        "Events URL",
        "background responses and batches ended, as OpenAI's webhook events; blank: none",
    ),
    "model_limits": (
        "Limits per model",
        "e.g. gpt-4o: rpm=100, tpm=50000; claude-sonnet-4: rpm=20 — beside the team's; blank: none",
    ),
    "scopes": (
        "Endpoints",
        f"the kinds its keys may call, of {', '.join(SCOPES)}; blank: every kind",
    ),
    "deployment_tags": (
        "Deployment tags",
        "e.g. eu — only deployments the catalog tags with every one serve the team; blank: any",
    ),
}


@dataclass
class TeamForm:
    values: dict[str, Any]  # as typed (models: a list), to fill the form again
    errors: dict[str, str] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)  # valid values, for tenancy.teams


def text(form: Any, name: str) -> str:
    """A text field of a submitted form (a FormMultiDict): "" when absent, or when a multipart
    request sent a file in its place."""
    value = form.get(name)
    return value if isinstance(value, str) else ""


def from_team(team: Team | None) -> TeamForm:
    """The form showing a team's current settings (an empty one for a new team)."""
    values: dict[str, Any] = {"name": team.name if team else ""}
    for name in LIMIT_FIELDS:
        value = getattr(team, name) if team else None
        if name == "models":
            value = [m for m in (value or "").split(",") if m]
        elif name == "default_tier":
            value = value or TIERS[0]
        elif name == "model_limits":
            value = model_limits_text(value)
        values[name] = "" if value is None else value
    return TeamForm(values)


def _value(raw: str, kind: type, name: str) -> tuple[Any, str | None]:
    """A typed field's value and what is wrong with it (tenancy's rule), or why it is no value."""
    if kind is str:
        return raw, problem(name, raw)
    if kind is dict:  # the per-model limits, as typed
        try:
            return parse_model_limits(raw), None
        except ValueError as exc:
            return None, str(exc)
    try:
        value = kind(raw)
    except ValueError:
        return (
            None,
            "must be a whole number (or blank)" if kind is int else "must be a number (or blank)",
        )
    return value, problem(name, value)


def picked_models(form: Any) -> list[str]:
    """The models ticked in a form (a team's or a key's)."""
    return [m for m in form.getall("models", []) if m and isinstance(m, str)]


def key_limits(form: Any) -> tuple[dict[str, Any], str]:
    """A key's own limits from its form (blank: the team's alone), and what is wrong with the
    first that is wrong ("": nothing)."""
    limits: dict[str, Any] = {}
    for name in KEY_LIMIT_FIELDS:
        raw = text(form, name).strip()
        value, error = _value(raw, LIMIT_FIELDS[name], name) if raw else (None, None)
        if error:
            return limits, f"{LABELS[name][0]} {error}"
        limits[name] = value
    return limits, ""


def parse(form: Any, catalog: list[str], with_name: bool) -> TeamForm:
    """Validate a submitted team form (a FormMultiDict) against the catalog's models."""
    result = TeamForm({"name": text(form, "name").strip()})
    if with_name and not TEAM_NAME.fullmatch(result.values["name"]):
        result.errors["name"] = TEAM_NAME_RULE
    for name, kind in LIMIT_FIELDS.items():
        if name == "models":
            picked = picked_models(form)
            result.values[name] = picked
            unknown = sorted(set(picked) - set(catalog))
            if unknown:
                result.errors[name] = f"not in the catalog: {', '.join(unknown)}"
            else:
                result.limits[name] = ",".join(m for m in catalog if m in picked)
            continue
        raw = text(form, name).strip()
        result.values[name] = raw
        if not raw and name != "default_tier":
            result.limits[name] = None
            continue
        value, error = _value(raw, kind, name)
        if name == "model_limits" and not error and (unknown := sorted(set(value) - set(catalog))):
            error = f"name models not in the catalog: {', '.join(unknown)}"
        if error:
            result.errors[name] = error
        else:
            result.limits[name] = value
    return result
