"""The operator's keys (admin, metrics): bearer tokens set in the settings, not team keys."""

import hmac
from hashlib import sha256


def bearer_is(authorization: str | None, key: str) -> bool:
    """Whether `Authorization: Bearer <key>` names this operator key (admin, metrics): compared as
    digests, so the comparison's time says nothing about the key, its length included."""
    scheme, _, given = (authorization or "").partition(" ")
    same = hmac.compare_digest(
        sha256(given.strip().encode()).digest(), sha256(key.encode()).digest()
    )
    return scheme.lower() == "bearer" and same
