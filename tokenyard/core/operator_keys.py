"""The operator's keys (admin, metrics): bearer tokens set in the settings, not team keys."""

import hmac
from hashlib import sha256

from tokenyard.core.errors import GatewayError
from tokenyard.core.settings import Settings


def bearer_is(authorization: str | None, key: str) -> bool:
    """Whether `Authorization: Bearer <key>` names this operator key (admin, metrics): compared as
    digests, so the comparison's time says nothing about the key, its length included."""
    scheme, _, given = (authorization or "").partition(" ")
    same = hmac.compare_digest(
        sha256(given.strip().encode()).digest(), sha256(key.encode()).digest()
    )
    return scheme.lower() == "bearer" and same


def admin_keys(settings: Settings) -> list[tuple[str, str]]:
    """(holder, key) of every admin key: the unnamed TOKENYARD_ADMIN_KEY as "admin", then each
    of TOKENYARD_ADMIN_KEYS (checked when the settings were read)."""
    keys = [("admin", settings.admin_key.get_secret_value())] if settings.admin_key else []
    for entry in settings.admin_keys.get_secret_value().split(","):
        name, _, key = entry.strip().partition("=")
        if key:
            keys.append((name, key))
    return keys


def require_admin(authorization: str | None, settings: Settings) -> str:
    """The admin-scoped APIs' check: off (403) with no admin key set, else one of them as bearer;
    returns its holder's name. Every key is compared (as digests): which one matched, and where in
    the list, takes no time to tell."""
    keys = admin_keys(settings)
    if not keys:
        raise GatewayError(403, "the admin API is off (no admin key set)", code="admin_off")
    holder = None
    for name, key in keys:
        if bearer_is(authorization, key) and holder is None:
            holder = name
    if holder is None:
        raise GatewayError(401, "this needs an admin key", code="invalid_admin_key")
    return holder
