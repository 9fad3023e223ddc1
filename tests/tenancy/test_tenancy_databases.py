"""Teams' and keys' limits on each database the platform runs on: every value the one rule
(tenancy/limits.py) accepts is stored and read back, PostgreSQL's 32-bit INTEGER included."""

from typing import Any

from sqlalchemy import Engine

from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.limits import LIMIT_FIELDS, MAX_COUNT


def test_the_largest_accepted_counts_are_stored(database: Engine) -> None:
    counts: dict[str, Any] = {n: MAX_COUNT for n, kind in LIMIT_FIELDS.items() if kind is int}
    teams.create_team(database, "big", **counts)
    team = teams.get_team(database, "big")
    assert team is not None and {n: getattr(team, n) for n in counts} == counts
    new = keys.create_key(database, "big", limits={"rpm": MAX_COUNT, "tpm": MAX_COUNT})
    listed = keys.get_key(database, new.prefix)
    assert listed is not None and listed.limits["rpm"] == listed.limits["tpm"] == MAX_COUNT
