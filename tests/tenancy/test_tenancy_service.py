"""tokenyard/tenancy/service.py: every change drops the cached lookups of exactly the keys it
concerns, in a real Redis, and a change still stands when Redis is unreachable."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from tests.gateway.conftest import RedisServer, free_port
from tokenyard.core.db import get_engine
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.errors import AlreadyExists, ManagementError, OperatorsChoice
from tokenyard.tenancy.service import Tenancy, cache_key

ME = "test:tenancy"  # who these tests' changes name


@pytest.fixture
def sql(tmp_path: Path) -> Any:
    return get_engine(f"sqlite:///{tmp_path / 'tenancy.db'}")


@pytest.fixture
async def tenancy(sql: Any, redis_server: RedisServer) -> AsyncIterator[Tenancy]:
    redis = aioredis.Redis.from_url(redis_server.url)
    yield Tenancy(sql, redis)
    await redis.aclose()


async def _team_with_keys(tenancy: Tenancy, name: str, count: int) -> list[str]:
    """A team with `count` keys, each key's lookup cached as a gateway leaves it; their secrets."""
    await tenancy.create_team(name, actor=ME)
    secrets = [(await tenancy.create_key(name, actor=ME)).key for _ in range(count)]
    for secret in secrets:
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    return secrets


async def _cached(tenancy: Tenancy, secrets: list[str]) -> list[bool]:
    return [bool(await tenancy.redis.exists(cache_key(keys.hash_key(s)))) for s in secrets]


async def test_each_change_drops_the_cached_lookups_of_its_keys_only(tenancy: Tenancy) -> None:
    mine = await _team_with_keys(tenancy, "mine", 2)
    other = await _team_with_keys(tenancy, "other", 1)

    team = await tenancy.update_team("mine", rpm=7, actor=ME)
    assert team.rpm == 7 and (await tenancy.team("mine")).rpm == 7  # type: ignore[union-attr]
    assert await _cached(tenancy, mine) == [False, False]
    assert await _cached(tenancy, other) == [True]

    for secret in mine:  # cached again by the next requests
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    assert (await tenancy.set_disabled("mine", True, actor=ME)).disabled
    assert await _cached(tenancy, mine) == [False, False]
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[0])) is None  # refused while disabled
    assert not (await tenancy.set_disabled("mine", False, actor=ME)).disabled
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[0])) is not None

    for secret in mine:
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    await tenancy.revoke_key(mine[0][: keys.KEY_PREFIX_LEN], actor=ME)
    assert await _cached(tenancy, mine) == [False, True]

    rotated = await tenancy.rotate_key(mine[1][: keys.KEY_PREFIX_LEN], actor=ME)
    assert rotated.team == "mine" and rotated.key != mine[1]
    assert await _cached(tenancy, mine) == [False, False]
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[1])) is None
    assert keys.lookup_key(tenancy.sql, keys.hash_key(rotated.key)) is not None

    await tenancy.delete_team("other", actor=ME)
    assert await _cached(tenancy, other) == [False]
    assert await tenancy.team("other") is None
    assert [k.team for k in await tenancy.keys()] == ["mine"] * 3


async def test_every_change_is_in_the_trail_with_who_made_it(tenancy: Tenancy) -> None:
    """Each change is a row written with it (newest first): who, what, the team and key, and what
    it set or changed; a change that changes nothing is no row, and no row holds a secret."""
    await tenancy.create_team("trail", rpm=5, models=["a"], actor="admin-ui:ops")
    made = await tenancy.create_key("trail", "ci", limits={"tpm": 100}, actor=ME)
    await tenancy.update_team("trail", rpm=9, tpm=None, actor="admin-api")
    await tenancy.update_team("trail", rpm=9, actor="admin-api")  # nothing changes: no row
    await tenancy.update_key(made.prefix, name="ci-2", tpm=None, actor=ME)
    await tenancy.set_disabled("trail", True, actor=ME)
    await tenancy.set_disabled("trail", True, actor=ME)  # already: no row
    rotated = await tenancy.rotate_key(made.prefix, actor=ME)
    await tenancy.revoke_key(rotated.prefix, actor=ME)
    await tenancy.delete_team("trail", actor="cli:root")
    trail = await tenancy.changes("trail", 100)
    assert [(c.actor, c.action, c.key_prefix) for c in trail] == [
        ("cli:root", "team.delete", None),
        (ME, "key.revoke", rotated.prefix),
        (ME, "key.rotate", made.prefix),
        (ME, "team.disable", None),
        (ME, "key.update", made.prefix),
        ("admin-api", "team.update", None),
        (ME, "key.create", made.prefix),
        ("admin-ui:ops", "team.create", None),
    ]
    details = [c.details for c in trail]
    assert details[0] == {"keys": [made.prefix, rotated.prefix]}
    assert details[2] == {"new_prefix": rotated.prefix}
    assert details[4] == {"name": ["ci", "ci-2"], "tpm": [100, None]}
    assert details[5] == {"rpm": [5, 9]}  # tpm was None already
    assert details[6] == {"name": "ci", "tpm": 100}
    assert details[7] == {"rpm": 5, "models": "a", "default_tier": "interactive"}
    assert made.key not in str(details) and rotated.key not in str(details)
    # newest first, a page at a time, one team's or every team's
    assert [c.id for c in await tenancy.changes("trail", 2, before=trail[1].id)] == [
        trail[2].id,
        trail[3].id,
    ]
    await tenancy.create_team("another", actor=ME)
    assert [c.team for c in await tenancy.changes(None, 2)] == ["another", "trail"]


async def test_blocked_end_users_travel_with_the_policy(tenancy: Tenancy) -> None:
    """Blocking drops the team's cached lookups, and the next lookup's policy names the end user;
    unblocking likewise; both are in the trail; a deleted team's blocks go with it."""
    secrets = await _team_with_keys(tenancy, "shop", 1)
    await tenancy.block_end_user("shop", "mallory", "audit row 42", actor=ME)
    assert await _cached(tenancy, secrets) == [False]
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(secrets[0]))
    assert policy is not None and policy.blocked_users == frozenset({"mallory"})
    with pytest.raises(AlreadyExists):
        await tenancy.block_end_user("shop", "mallory", actor=ME)
    for bad in ("", "x" * 129, "a\x00b"):
        with pytest.raises(ValueError):
            await tenancy.block_end_user("shop", bad, actor=ME)
    with pytest.raises(ManagementError):
        await tenancy.block_end_user("no-such-team", "eve", actor=ME)
    await tenancy.block_end_user("shop", "eve", actor=ME)
    assert [(b.end_user, b.reason) for b in await tenancy.blocked("shop")] == [
        ("mallory", "audit row 42"),
        ("eve", None),
    ]
    await tenancy.redis.set(cache_key(keys.hash_key(secrets[0])), b"cached")
    await tenancy.unblock_end_user("shop", "mallory", actor=ME)
    assert await _cached(tenancy, secrets) == [False]
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(secrets[0]))
    assert policy is not None and policy.blocked_users == frozenset({"eve"})
    with pytest.raises(ManagementError):
        await tenancy.unblock_end_user("shop", "mallory", actor=ME)
    trail = [(c.action, c.details) for c in await tenancy.changes("shop", 3)]
    assert trail == [
        ("user.unblock", {"end_user": "mallory"}),
        ("user.block", {"end_user": "eve", "reason": None}),
        ("user.block", {"end_user": "mallory", "reason": "audit row 42"}),
    ]
    await tenancy.delete_team("shop", actor=ME)
    await tenancy.create_team("shop", actor=ME)  # the same name, afresh
    assert await tenancy.blocked("shop") == []


async def test_refusals_change_nothing(tenancy: Tenancy) -> None:
    secrets = await _team_with_keys(tenancy, "kept", 1)
    with pytest.raises(AlreadyExists):
        await tenancy.create_team("kept", actor=ME)
    with pytest.raises(ValueError, match="between 0 and 1"):
        await tenancy.update_team("kept", auto_threshold=2.0, actor=ME)
    with pytest.raises(ValueError, match="unknown team field"):
        await tenancy.update_team("kept", webhook_secret="whsec_x", actor=ME)
    with pytest.raises(ValueError, match="at most"):
        await tenancy.update_team("kept", rpm=2**63, actor=ME)  # what the CLI's --rpm lets through
    with pytest.raises(ValueError, match="0 or more"):
        await tenancy.update_team("kept", usd_per_day=float("inf"), actor=ME)
    with pytest.raises(ValueError, match="whole number"):
        await tenancy.update_team("kept", concurrency=True, actor=ME)
    with pytest.raises(ManagementError):
        await tenancy.update_team("missing", rpm=1, actor=ME)
    with pytest.raises(ManagementError):
        await tenancy.revoke_key("ty-missing00", actor=ME)
    assert await _cached(tenancy, secrets) == [True]
    team = await tenancy.team("kept")
    assert team is not None and team.auto_threshold is None and team.rpm is None
    # and none of them is in the trail
    assert [c.action for c in await tenancy.changes("kept", 10)] == ["key.create", "team.create"]


async def test_a_change_stands_when_redis_is_unreachable(sql: Any) -> None:
    # a loopback port with nothing listening: the delete fails at once
    gone = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.5)
    tenancy = Tenancy(sql, gone)
    await tenancy.create_team("offline", actor=ME)
    secret = (await tenancy.create_key("offline", actor=ME)).key
    team = await asyncio.wait_for(tenancy.update_team("offline", tpm=5, actor=ME), 5)
    assert team.tpm == 5
    await asyncio.wait_for(tenancy.revoke_key(secret[: keys.KEY_PREFIX_LEN], actor=ME), 5)
    assert keys.lookup_key(sql, keys.hash_key(secret)) is None
    await gone.aclose()


async def test_concurrent_creates_of_one_team_make_one_team(tenancy: Tenancy) -> None:
    results = await asyncio.gather(
        *(tenancy.create_team("racing", actor=ME) for _ in range(8)), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1
    assert all(isinstance(r, AlreadyExists) for r in results if isinstance(r, BaseException))
    assert [t.name for t in await tenancy.teams()] == ["racing"]


async def test_an_expired_key_is_refused_and_rotation_keeps_name_and_expiry(
    tenancy: Tenancy,
) -> None:
    await tenancy.create_team("timed", actor=ME)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    made = await tenancy.create_key("timed", "  ci  ", soon, actor=ME)
    assert (made.name, made.expires_at) == ("ci", soon)  # the name stripped
    assert keys.lookup_key(tenancy.sql, keys.hash_key(made.key)) is not None
    rotated = await tenancy.rotate_key(made.prefix, actor=ME)
    assert (rotated.name, rotated.expires_at) == ("ci", soon)
    await asyncio.sleep((soon - datetime.now(UTC)).total_seconds() + 0.1)
    assert keys.lookup_key(tenancy.sql, keys.hash_key(rotated.key)) is None
    assert {k.prefix: k.state for k in await tenancy.keys("timed")} == {
        made.prefix: "revoked",
        rotated.prefix: "expired",
    }
    unnamed = await tenancy.create_key("timed", "   ", actor=ME)
    assert unnamed.name is None and unnamed.expires_at is None
    for name, expires in (
        ("x" * 65, None),
        ("bell\a", None),
        (None, datetime.now(UTC) - timedelta(seconds=1)),
        (None, datetime.now() + timedelta(days=1)),  # no time zone: which day is it?
    ):
        with pytest.raises(ValueError):
            await tenancy.create_key("timed", name, expires, actor=ME)


async def test_a_key_narrows_its_teams_models_for_requests_and_batch_jobs(
    tenancy: Tenancy,
) -> None:
    await tenancy.create_team("models", models=["a", "b", "c"], actor=ME)
    narrow = await tenancy.create_key("models", models=[" b", "a", "b"], actor=ME)
    assert narrow.models == ("b", "a")  # stripped, once each, in the order given
    wide = await tenancy.create_key("models", actor=ME)
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(narrow.key))
    assert policy is not None and policy.models == ("b", "a")
    by_prefix = keys.policy_by_prefix(tenancy.sql, "models", narrow.prefix)
    assert by_prefix is not None and by_prefix.models == ("b", "a")
    assert keys.policy_by_prefix(tenancy.sql, "models", wide.prefix).models == ("a", "b", "c")  # type: ignore[union-attr]
    assert keys.policy_by_prefix(tenancy.sql, "missing", wide.prefix) is None
    with pytest.raises(ValueError, match="may not use d"):
        await tenancy.create_key("models", models=["a", "d"], actor=ME)
    with pytest.raises(ValueError, match="no commas"):
        await tenancy.create_key("models", models=["a,b"], actor=ME)
    # the team's list narrowed past the key's: the key may use none of its models
    await tenancy.update_team("models", models=["c"], actor=ME)
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(narrow.key))
    assert policy is not None and policy.models and not set(policy.models) & {"a", "b", "c"}
    rotated = await tenancy.rotate_key(narrow.prefix, actor=ME)
    assert rotated.models == ("b", "a")


async def test_a_key_is_renamed_extended_and_narrowed_in_place(tenancy: Tenancy) -> None:
    await tenancy.create_team("changing", models=["a", "b"], actor=ME)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    made = await tenancy.create_key("changing", "old", soon, actor=ME)
    cached = cache_key(keys.hash_key(made.key))
    await tenancy.redis.set(cached, b"cached")
    await asyncio.sleep((soon - datetime.now(UTC)).total_seconds() + 0.1)
    assert keys.lookup_key(tenancy.sql, keys.hash_key(made.key)) is None  # expired
    later = datetime.now(UTC) + timedelta(days=1)
    info = await tenancy.update_key(
        made.prefix, name="new", expires_at=later, models=["b"], actor=ME
    )
    assert (info.name, info.expires_at, info.models, info.state) == ("new", later, ("b",), "active")
    assert not await tenancy.redis.exists(cached)  # the change applies at once
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(made.key))  # revived by the new expiry
    assert policy is not None and policy.models == ("b",)
    # the rest left as it was
    kept = await tenancy.update_key(made.prefix, expires_at=None, actor=ME)
    assert (kept.name, kept.expires_at, kept.models) == ("new", None, ("b",))
    cleared = await tenancy.update_key(made.prefix, name=None, models=[], actor=ME)
    assert (cleared.name, cleared.models) == (None, ())
    for bad in ({"models": ["c"]}, {"expires_at": soon}, {"name": "x" * 65}, {"team": "other"}):
        with pytest.raises(ValueError):
            await tenancy.update_key(made.prefix, **bad, actor=ME)
    await tenancy.redis.set(cached, b"cached")
    limited = await tenancy.update_key(
        made.prefix,
        rpm=3,
        usd_per_day=0.5,
        usd_per_month=9.0,
        concurrency=2,
        model_limits={"b": {"rpm": 4, "tpm": 40}},
        actor=ME,
    )
    assert limited.limits == {
        "rpm": 3,
        "tpm": None,
        "usd_per_day": 0.5,
        "usd_per_month": 9.0,
        "concurrency": 2,
        "model_limits": {"b": {"rpm": 4, "tpm": 40}},
        "scopes": None,
    }
    assert not await tenancy.redis.exists(cached)
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(made.key))  # what reserve reads
    assert policy is not None and (policy.key_prefix, policy.key_rpm) == (made.prefix, 3)
    assert (policy.key_tpm, policy.key_usd_per_day, policy.rpm) == (0, 0.5, 0)
    assert (policy.key_concurrency, policy.concurrency, policy.key_usd_per_month) == (2, 0, 9.0)
    assert (policy.key_model_limit("b"), policy.key_model_limit("a")) == ((4, 40), (0, 0))
    for bad in ({"rpm": -1}, {"tpm": 2**60}, {"usd_per_day": float("nan")}, {"rpm": 1.5}):
        with pytest.raises(ValueError):
            await tenancy.update_key(made.prefix, **bad, actor=ME)
    rotated = await tenancy.rotate_key(made.prefix, actor=ME)
    assert rotated.limits == limited.limits  # kept by rotation
    with pytest.raises(ValueError, match="no limit"):
        await tenancy.create_key("changing", limits={"kv_pages": 1}, actor=ME)
    with pytest.raises(ManagementError):  # rotation revoked it
        await tenancy.update_key(made.prefix, name="revived?", actor=ME)


def test_a_teams_own_receiver_stays_the_teams_until_the_operator_changes_it(sql: Any) -> None:
    """Saving a team's form whole (its receiver unchanged) keeps a receiver the team set held to
    the team's rule; only a new URL from the operator makes it the operator's."""
    teams.create_team(sql, "hooks", actor=ME)
    mine = "https://hooks.example.com/mine"
    team = teams.set_own_webhook(sql, "hooks", mine, actor="team-api:ty-x")
    assert (team.webhook_url, team.webhook_url_by_team) == (mine, True)
    team, _ = teams.update_team(sql, "hooks", actor=ME, rpm=5, webhook_url=mine)
    assert team.webhook_url_by_team and team.rpm == 5
    team, _ = teams.update_team(sql, "hooks", actor=ME, webhook_url="http://10.0.0.7/ops")
    assert not team.webhook_url_by_team
    with pytest.raises(OperatorsChoice):
        teams.set_own_webhook(sql, "hooks", None, actor="team-api:ty-x")
    team, _ = teams.update_team(sql, "hooks", actor=ME, webhook_url="")  # the operator clears it
    assert teams.set_own_webhook(sql, "hooks", mine, actor="team-api:ty-x").webhook_url_by_team
