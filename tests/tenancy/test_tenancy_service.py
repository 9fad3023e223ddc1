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
from tokenyard.tenancy import keys
from tokenyard.tenancy.errors import AlreadyExists, ManagementError
from tokenyard.tenancy.service import Tenancy, cache_key


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
    await tenancy.create_team(name)
    secrets = [(await tenancy.create_key(name)).key for _ in range(count)]
    for secret in secrets:
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    return secrets


async def _cached(tenancy: Tenancy, secrets: list[str]) -> list[bool]:
    return [bool(await tenancy.redis.exists(cache_key(keys.hash_key(s)))) for s in secrets]


async def test_each_change_drops_the_cached_lookups_of_its_keys_only(tenancy: Tenancy) -> None:
    mine = await _team_with_keys(tenancy, "mine", 2)
    other = await _team_with_keys(tenancy, "other", 1)

    team = await tenancy.update_team("mine", rpm=7)
    assert team.rpm == 7 and (await tenancy.team("mine")).rpm == 7  # type: ignore[union-attr]
    assert await _cached(tenancy, mine) == [False, False]
    assert await _cached(tenancy, other) == [True]

    for secret in mine:  # cached again by the next requests
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    assert (await tenancy.set_disabled("mine", True)).disabled
    assert await _cached(tenancy, mine) == [False, False]
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[0])) is None  # refused while disabled
    assert not (await tenancy.set_disabled("mine", False)).disabled
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[0])) is not None

    for secret in mine:
        await tenancy.redis.set(cache_key(keys.hash_key(secret)), b"cached")
    await tenancy.revoke_key(mine[0][: keys.KEY_PREFIX_LEN])
    assert await _cached(tenancy, mine) == [False, True]

    rotated = await tenancy.rotate_key(mine[1][: keys.KEY_PREFIX_LEN])
    assert rotated.team == "mine" and rotated.key != mine[1]
    assert await _cached(tenancy, mine) == [False, False]
    assert keys.lookup_key(tenancy.sql, keys.hash_key(mine[1])) is None
    assert keys.lookup_key(tenancy.sql, keys.hash_key(rotated.key)) is not None

    await tenancy.delete_team("other")
    assert await _cached(tenancy, other) == [False]
    assert await tenancy.team("other") is None
    assert [k.team for k in await tenancy.keys()] == ["mine"] * 3


async def test_refusals_change_nothing(tenancy: Tenancy) -> None:
    secrets = await _team_with_keys(tenancy, "kept", 1)
    with pytest.raises(AlreadyExists):
        await tenancy.create_team("kept")
    with pytest.raises(ValueError, match="between 0 and 1"):
        await tenancy.update_team("kept", auto_threshold=2.0)
    with pytest.raises(ValueError, match="unknown team field"):
        await tenancy.update_team("kept", webhook_secret="whsec_x")
    with pytest.raises(ValueError, match="at most"):
        await tenancy.update_team("kept", rpm=2**63)  # what the CLI's --rpm lets through
    with pytest.raises(ValueError, match="0 or more"):
        await tenancy.update_team("kept", usd_per_day=float("inf"))
    with pytest.raises(ValueError, match="whole number"):
        await tenancy.update_team("kept", concurrency=True)
    with pytest.raises(ManagementError):
        await tenancy.update_team("missing", rpm=1)
    with pytest.raises(ManagementError):
        await tenancy.revoke_key("ty-missing00")
    assert await _cached(tenancy, secrets) == [True]
    team = await tenancy.team("kept")
    assert team is not None and team.auto_threshold is None and team.rpm is None


async def test_a_change_stands_when_redis_is_unreachable(sql: Any) -> None:
    # a loopback port with nothing listening: the delete fails at once
    gone = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.5)
    tenancy = Tenancy(sql, gone)
    await tenancy.create_team("offline")
    secret = (await tenancy.create_key("offline")).key
    team = await asyncio.wait_for(tenancy.update_team("offline", tpm=5), 5)
    assert team.tpm == 5
    await asyncio.wait_for(tenancy.revoke_key(secret[: keys.KEY_PREFIX_LEN]), 5)
    assert keys.lookup_key(sql, keys.hash_key(secret)) is None
    await gone.aclose()


async def test_concurrent_creates_of_one_team_make_one_team(tenancy: Tenancy) -> None:
    results = await asyncio.gather(
        *(tenancy.create_team("racing") for _ in range(8)), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1
    assert all(isinstance(r, AlreadyExists) for r in results if isinstance(r, BaseException))
    assert [t.name for t in await tenancy.teams()] == ["racing"]


async def test_an_expired_key_is_refused_and_rotation_keeps_name_and_expiry(
    tenancy: Tenancy,
) -> None:
    await tenancy.create_team("timed")
    soon = datetime.now(UTC) + timedelta(seconds=1)
    made = await tenancy.create_key("timed", "  ci  ", soon)
    assert (made.name, made.expires_at) == ("ci", soon)  # the name stripped
    assert keys.lookup_key(tenancy.sql, keys.hash_key(made.key)) is not None
    rotated = await tenancy.rotate_key(made.prefix)
    assert (rotated.name, rotated.expires_at) == ("ci", soon)
    await asyncio.sleep((soon - datetime.now(UTC)).total_seconds() + 0.1)
    assert keys.lookup_key(tenancy.sql, keys.hash_key(rotated.key)) is None
    assert {k.prefix: k.state for k in await tenancy.keys("timed")} == {
        made.prefix: "revoked",
        rotated.prefix: "expired",
    }
    unnamed = await tenancy.create_key("timed", "   ")
    assert unnamed.name is None and unnamed.expires_at is None
    for name, expires in (
        ("x" * 65, None),
        ("bell\a", None),
        (None, datetime.now(UTC) - timedelta(seconds=1)),
        (None, datetime.now() + timedelta(days=1)),  # no time zone: which day is it?
    ):
        with pytest.raises(ValueError):
            await tenancy.create_key("timed", name, expires)


async def test_a_key_narrows_its_teams_models_for_requests_and_batch_jobs(
    tenancy: Tenancy,
) -> None:
    await tenancy.create_team("models", models=["a", "b", "c"])
    narrow = await tenancy.create_key("models", models=[" b", "a", "b"])
    assert narrow.models == ("b", "a")  # stripped, once each, in the order given
    wide = await tenancy.create_key("models")
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(narrow.key))
    assert policy is not None and policy.models == ("b", "a")
    by_prefix = keys.policy_by_prefix(tenancy.sql, "models", narrow.prefix)
    assert by_prefix is not None and by_prefix.models == ("b", "a")
    assert keys.policy_by_prefix(tenancy.sql, "models", wide.prefix).models == ("a", "b", "c")  # type: ignore[union-attr]
    assert keys.policy_by_prefix(tenancy.sql, "missing", wide.prefix) is None
    with pytest.raises(ValueError, match="may not use d"):
        await tenancy.create_key("models", models=["a", "d"])
    with pytest.raises(ValueError, match="no commas"):
        await tenancy.create_key("models", models=["a,b"])
    # the team's list narrowed past the key's: the key may use none of its models
    await tenancy.update_team("models", models=["c"])
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(narrow.key))
    assert policy is not None and policy.models and not set(policy.models) & {"a", "b", "c"}
    rotated = await tenancy.rotate_key(narrow.prefix)
    assert rotated.models == ("b", "a")


async def test_a_key_is_renamed_extended_and_narrowed_in_place(tenancy: Tenancy) -> None:
    await tenancy.create_team("changing", models=["a", "b"])
    soon = datetime.now(UTC) + timedelta(seconds=1)
    made = await tenancy.create_key("changing", "old", soon)
    cached = cache_key(keys.hash_key(made.key))
    await tenancy.redis.set(cached, b"cached")
    await asyncio.sleep((soon - datetime.now(UTC)).total_seconds() + 0.1)
    assert keys.lookup_key(tenancy.sql, keys.hash_key(made.key)) is None  # expired
    later = datetime.now(UTC) + timedelta(days=1)
    info = await tenancy.update_key(made.prefix, name="new", expires_at=later, models=["b"])
    assert (info.name, info.expires_at, info.models, info.state) == ("new", later, ("b",), "active")
    assert not await tenancy.redis.exists(cached)  # the change applies at once
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(made.key))  # revived by the new expiry
    assert policy is not None and policy.models == ("b",)
    kept = await tenancy.update_key(made.prefix, expires_at=None)  # the rest left as it was
    assert (kept.name, kept.expires_at, kept.models) == ("new", None, ("b",))
    cleared = await tenancy.update_key(made.prefix, name=None, models=[])
    assert (cleared.name, cleared.models) == (None, ())
    for bad in ({"models": ["c"]}, {"expires_at": soon}, {"name": "x" * 65}, {"team": "other"}):
        with pytest.raises(ValueError):
            await tenancy.update_key(made.prefix, **bad)
    await tenancy.redis.set(cached, b"cached")
    limited = await tenancy.update_key(made.prefix, rpm=3, usd_per_day=0.5, concurrency=2)
    assert limited.limits == {"rpm": 3, "tpm": None, "usd_per_day": 0.5, "concurrency": 2}
    assert not await tenancy.redis.exists(cached)
    policy = keys.lookup_key(tenancy.sql, keys.hash_key(made.key))  # what reserve reads
    assert policy is not None and (policy.key_prefix, policy.key_rpm) == (made.prefix, 3)
    assert (policy.key_tpm, policy.key_usd_per_day, policy.rpm) == (0, 0.5, 0)
    assert (policy.key_concurrency, policy.concurrency) == (2, 0)
    for bad in ({"rpm": -1}, {"tpm": 2**60}, {"usd_per_day": float("nan")}, {"rpm": 1.5}):
        with pytest.raises(ValueError):
            await tenancy.update_key(made.prefix, **bad)
    assert (await tenancy.rotate_key(made.prefix)).limits == limited.limits  # kept by rotation
    with pytest.raises(ValueError, match="no limit"):
        await tenancy.create_key("changing", limits={"kv_pages": 1})
    with pytest.raises(ManagementError):  # rotation revoked it
        await tenancy.update_key(made.prefix, name="revived?")
