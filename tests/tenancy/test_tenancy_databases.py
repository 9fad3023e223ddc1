"""Teams' and keys' settings on each database the platform runs on: every value the one rule
(tenancy/limits.py) accepts is stored and read back (PostgreSQL's INTEGER is 32-bit), and an
expiry comes back as the instant it was."""

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.limits import LIMIT_FIELDS, MAX_COUNT


def test_the_largest_accepted_counts_are_stored(database: Engine) -> None:
    counts: dict[str, Any] = {n: MAX_COUNT for n, kind in LIMIT_FIELDS.items() if kind is int}
    teams.create_team(database, "big", **counts)
    team = teams.get_team(database, "big")
    assert team is not None and {n: getattr(team, n) for n in counts} == counts
    expires = datetime.now(UTC) + timedelta(days=1)
    limits = {"rpm": MAX_COUNT, "tpm": MAX_COUNT}
    new = keys.create_key(database, "big", "big", expires, limits=limits)
    listed = keys.get_key(database, new.prefix)
    assert listed is not None and listed.limits["rpm"] == listed.limits["tpm"] == MAX_COUNT
    # an expiry reads back as the same instant, with its time zone: the state compares it to now
    assert listed.expires_at == expires and listed.state == "active"
    policy = keys.lookup_key(database, keys.hash_key(new.key))
    assert policy is not None and policy.key_rpm == MAX_COUNT
