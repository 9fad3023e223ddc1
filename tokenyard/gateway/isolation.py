"""Which requests may share the self-hosted engine's prefix cache (`cache_salt`, vLLM's field).

A prompt whose start another request left in the cache is read faster, and its usage says how
many of its tokens were cached: whoever shares a cache learns whether a prompt was sent before.
Across teams that tells one team what another sent, so by default (scope `team`,
`TOKENYARD_GATEWAY_PREFIX_CACHE_SCOPE`) every request reaches the engine with a salt of its team,
and requests share cached blocks only within a team. A client may narrow that further with its
own `cache_salt` (per end user, per conversation): its salt is namespaced by the team too, so no
team can name another's. `shared` lets every request without a salt of its own share (a deployment
of one team, or of teams that trust each other). Commercial providers never see the field: they
keep their own caches per account.
"""

import hashlib

from tokenyard.core.errors import GatewayError

MAX_SALT = 256  # characters of a client's salt, as the engine takes it


def cache_salt(scope: str, team: str, asked: object) -> str | None:
    """The salt the engine gets for a request of `team` whose body asked for `asked` (None: the
    request shares the cache with every request without a salt)."""
    if asked is not None and (not isinstance(asked, str) or not 1 <= len(asked) <= MAX_SALT):
        raise GatewayError(
            400, f"cache_salt must be a string of 1 to {MAX_SALT} characters", param="cache_salt"
        )
    if asked is None and scope == "shared":
        return None
    return hashlib.sha256(f"{team}\0{asked or ''}".encode()).hexdigest()
