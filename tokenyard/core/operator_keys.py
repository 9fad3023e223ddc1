"""The operator's keys (admin, metrics): bearer tokens set in the settings, not team keys."""

import hmac
from hashlib import sha256

from pydantic import SecretStr

from tokenyard.core.errors import GatewayError


def bearer_is(authorization: str | None, key: str) -> bool:
    """Whether `Authorization: Bearer <key>` names this operator key (admin, metrics): compared as
    digests, so the comparison's time says nothing about the key, its length included."""
    scheme, _, given = (authorization or "").partition(" ")
    same = hmac.compare_digest(
        sha256(given.strip().encode()).digest(), sha256(key.encode()).digest()
    )
    return scheme.lower() == "bearer" and same


def require_admin(authorization: str | None, admin_key: SecretStr) -> None:
    """The admin-scoped APIs' check: off (403) with no admin key set, else the key as bearer."""
    if not admin_key:
        raise GatewayError(403, "the admin API is off (no admin key set)", code="admin_off")
    if not bearer_is(authorization, admin_key.get_secret_value()):
        raise GatewayError(401, "this needs the admin key", code="invalid_admin_key")
