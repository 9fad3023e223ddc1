"""A commercial model at several deployments (an Azure resource's and OpenAI's own API here): the
catalog's checks, each request at one deployment by weight, load, prompt prefix and the team's
deployment tags, a deployment that refuses or is down skipped at once for its Retry-After or
cooldown while the other answers, and a stream's share of load held until it closes."""

import asyncio
import json
import random
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.backends.conftest import KEY_ENV, control, free_port, stats
from tests.backends.test_backends_openai import CHAT, call, read_stream
from tokenyard.backends.api import ApiClient
from tokenyard.backends.base import (
    BackendUnavailable,
    ModelInfo,
    Upstream,
    UpstreamBroken,
    UpstreamCall,
)
from tokenyard.backends.deployments import Deployment, Deployments
from tokenyard.backends.retry import Guard, RetryPolicy
from tokenyard.router.catalog import Catalog, CatalogError, CatalogFile, DeploymentEntry, ModelEntry

VERSION = "2024-10-21"


def catalog(**model: Any) -> Catalog:
    entry = {"id": "gpt-4o", "provider": "openai", **model}
    return Catalog(msgspec.convert({"models": [entry]}, CatalogFile))


def test_the_catalog_takes_deployments_and_refuses_what_cannot_be_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eu = {"base_url": "https://eu.example/openai/deployments/4o", "api_key_env": "EU_KEY"}
    us = {"base_url": "https://api.example/v1", "api_key_env": "US_KEY", "provider": "openai"}
    model = catalog(provider="azure", deployments=[{**eu, "api_version": VERSION}, us])
    entry = model.models["gpt-4o"]
    assert [(d.label, d.provider, d.upstream_model) for d in entry.all_deployments] == [
        ("eu.example", "azure", "gpt-4o"),
        ("api.example", "openai", "gpt-4o"),
    ]
    assert not entry.configured  # no key set
    monkeypatch.setenv("US_KEY", "k")
    assert entry.configured and [d.label for d in entry.live_deployments] == ["api.example"]
    one = catalog(base_urls=["https://api.example/v1"], api_key_env="US_KEY")
    assert [d.base_url for d in one.models["gpt-4o"].live_deployments] == ["https://api.example/v1"]

    refused = {
        "replace base_urls": {"base_urls": ["https://x/v1"], "deployments": [us]},
        "self-hosted": {"provider": "self-hosted", "deployments": [us]},
        "speaks anthropic": {"deployments": [us, {**eu, "provider": "anthropic"}]},
        "needs its api_version": {"provider": "azure", "deployments": [eu]},
        "distinct names": {"deployments": [us, {**us, "weight": 2}]},
        "one base URL": {"base_urls": ["https://a/v1", "https://b/v1"], "api_key_env": "K"},
        "not both": {"deployments": [{**us, "entra": {}}]},
        "api_key_env or entra": {"deployments": [{"base_url": "https://x/v1"}]},
        "Azure only": {"deployments": [{**us, "api_key_env": "", "entra": {}}]},
        "together": {
            "provider": "azure",
            "deployments": [
                {**eu, "api_key_env": "", "api_version": VERSION, "entra": {"tenant_id": "t"}}
            ],
        },
    }
    for why, fields in refused.items():
        with pytest.raises(CatalogError, match=why):
            catalog(**fields)
    # keys turned off: Entra ID, from the environment's identity or a service principal whose
    # secret must be set
    entra = {**eu, "api_key_env": "", "api_version": VERSION}
    sp = {"tenant_id": "t", "client_id": "c", "client_secret_env": "SP_SECRET"}
    azure = catalog(provider="azure", deployments=[{**entra, "entra": {}}])
    assert azure.models["gpt-4o"].configured
    azure = catalog(provider="azure", deployments=[{**entra, "entra": sp}])
    assert not azure.models["gpt-4o"].configured
    monkeypatch.setenv("SP_SECRET", "s")
    assert azure.models["gpt-4o"].configured
    with pytest.raises(msgspec.ValidationError):  # a weight of 0 would never be picked
        msgspec.convert({**us, "weight": 0}, DeploymentEntry)


def deployments(*weights: float, seed: int = 0) -> Deployments:
    api = ApiClient("http://127.0.0.1:9", {}, RetryPolicy(), 1)  # never called
    made = [Deployment(f"d{i}", api, "m", weight=w) for i, w in enumerate(weights)]
    return Deployments(made, Guard(ModelInfo("m"), RetryPolicy()), rng=random.Random(seed))


def shares(pool: Deployments, picks: int = 4000, **pick: Any) -> dict[str, float]:
    counts: dict[str, int] = {}
    for _ in range(picks):
        name = pool.pick(**pick).name
        counts[name] = counts.get(name, 0) + 1
    return {name: n / picks for name, n in counts.items()}


def test_idle_deployments_share_by_weight_and_busy_ones_by_load() -> None:
    pool = deployments(3, 1)
    idle = shares(pool)
    assert 0.72 < idle["d0"] < 0.78  # 3:1, four thousand draws
    pool.all[0].in_flight = 12  # 4 a unit of weight against none: the idle one takes nearly all
    assert shares(pool)["d1"] > 0.95
    pool.all[1].in_flight = 4  # equally busy for their weights: by weight again
    assert 0.72 < shares(pool)["d0"] < 0.78


def test_a_pick_passes_over_tried_and_cooling_deployments() -> None:
    pool = deployments(1, 1, 1)
    assert set(shares(pool, 200, tried={"d0"})) == {"d1", "d2"}
    pool.all[1].down_until = time.monotonic() + 60
    assert set(shares(pool, 200, tried={"d0"})) == {"d2"}
    assert set(shares(pool, 200, tried={"d0", "d2"})) == {"d0", "d2"}  # all tried: any not cooling
    for d in pool.all:
        d.down_until = time.monotonic() + 60
    pool.all[2].down_until = time.monotonic() + 5
    assert set(shares(pool, 50)) == {"d2"}  # all cooling: the one back soonest


def test_a_request_bound_to_tags_goes_only_to_deployments_carrying_them_all() -> None:
    pool = deployments(1, 1000)
    pool.all[0].tags, pool.all[1].tags = frozenset({"eu", "zero-retention"}), frozenset({"us"})
    assert set(shares(pool, 200, tags=frozenset({"eu"}))) == {"d0"}
    assert set(shares(pool, 200, tags=frozenset({"eu", "zero-retention"}))) == {"d0"}
    pool.all[0].down_until = time.monotonic() + 60  # cooling: still never the US one
    assert set(shares(pool, 50, tried={"d0"}, tags=frozenset({"eu"}))) == {"d0"}
    with pytest.raises(BackendUnavailable, match="no deployment your team may use"):
        pool.pick(tags=frozenset({"eu", "us"}))


def test_a_prompt_prefix_keeps_to_its_home_deployment_while_its_load_allows() -> None:
    pool = deployments(3, 1)
    homes = {pool.pick(prefix="system prompt 7").name for _ in range(20)}
    assert len(homes) == 1  # one prefix, one deployment: its prompt cache there
    spread: dict[str, int] = {}
    for i in range(2000):
        name = pool.pick(prefix=f"system prompt {i}").name
        spread[name] = spread.get(name, 0) + 1
    assert 0.72 < spread["d0"] / 2000 < 0.78  # homes in proportion to the weights
    home = pool.all[0] if homes == {"d0"} else pool.all[1]
    home.in_flight = int(3 * home.weight)  # 3 a unit of weight over the other's 0: past the margin
    assert pool.pick(prefix="system prompt 7").name != home.name


@pytest.fixture
def group(
    build_entry: Any, monkeypatch: pytest.MonkeyPatch, openai_url: str, azure_url: str
) -> Callable[..., Upstream]:
    """A model at an Azure deployment and at OpenAI's API: group(openai=dict(…), azure=dict(…))
    with each deployment's own catalog fields."""
    monkeypatch.setenv(KEY_ENV, "sk-test-secret")
    for url in (openai_url, azure_url):
        control(url, reset=True)

    def make(openai: dict[str, Any] | None = None, azure: dict[str, Any] | None = None, **s: Any):
        azure_at = {
            "base_url": azure_url + "/openai/deployments/prod-4o",
            "provider": "azure",
            "api_version": VERSION,
            "name": "azure",
        }
        openai_at = {
            "base_url": openai_url + "/v1",
            "provider": "openai",
            "upstream_model": "gpt-4o-2024-08-06",
            "name": "openai",
        }
        places = (
            DeploymentEntry(**{**azure_at, **(azure or {})}, api_key_env=KEY_ENV),
            DeploymentEntry(**{**openai_at, **(openai or {})}, api_key_env=KEY_ENV),
        )
        return build_entry(ModelEntry(id="gpt-4o", provider="azure", deployments=places), **s)

    return make


async def test_requests_spread_over_deployments_each_called_its_own_way(
    group: Any, openai_url: str, azure_url: str
) -> None:
    upstream = group()
    for i in range(16):
        reply = await upstream.complete(call(f"hello {i} #chunks=2"))
        assert reply.status == 200 and msgspec.json.decode(reply.body)["model"] == "gpt-4o"
    at_openai, at_azure = stats(openai_url), stats(azure_url)
    assert at_openai["requests"] + at_azure["requests"] == 16
    assert at_openai["requests"] >= 2 and at_azure["requests"] >= 2  # 2^-15 odds of a miss
    assert at_openai["last_body"]["model"] == "gpt-4o-2024-08-06"
    assert at_openai["last_headers"]["authorization"] == "Bearer sk-test-secret"
    assert (at_azure["deployment"], at_azure["api_version"]) == ("prod-4o", VERSION)
    # (the Azure fake answers 401 to a request without its api-key header)


async def test_a_rate_limited_deployment_is_skipped_at_once_for_its_retry_after(
    group: Any, openai_url: str, azure_url: str
) -> None:
    # all traffic to OpenAI's deployment while idle, until it answers 429 asking for 30 s
    upstream = group(azure={"weight": 1e-6}, backend_retry_after_max_s=30)
    control(openai_url, fail_next=1, status=429, retry_after=30)
    started = time.monotonic()
    reply = await upstream.complete(call("hello #chunks=2"))
    assert reply.status == 200 and time.monotonic() - started < 3  # no 30 s wait: Azure took it
    assert (stats(openai_url)["requests"], stats(azure_url)["requests"]) == (1, 1)
    raw = await read_stream(upstream, call("again #chunks=2", stream=True))
    assert b"w1" in raw
    assert (stats(openai_url)["requests"], stats(azure_url)["requests"]) == (1, 2)  # cooling
    assert upstream.info.ready and upstream.info.circuit == "closed"


async def test_a_deployment_that_is_down_costs_no_request_its_failure(group: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    upstream = group(openai={"base_url": dead}, azure={"weight": 1e-6})
    for i in range(4):
        reply = await upstream.complete(call(f"hi {i} #chunks=2"))
        assert reply.status == 200
    pool = upstream.deployments  # type: ignore[attr-defined]
    assert pool.all[1].down_until > time.monotonic()  # cooling after its one refused connection


async def test_requests_sharing_a_system_prompt_meet_at_one_deployment(
    group: Any, openai_url: str, azure_url: str
) -> None:
    upstream = group()
    for i in range(6):
        system = {"role": "system", "content": "You answer as a ship's log."}
        body = {"model": "m", "messages": [system, {"role": "user", "content": f"q{i} #chunks=2"}]}
        reply = await upstream.complete(
            UpstreamCall(CHAT, json.dumps(body).encode(), {}, "You answer as a ship's log.")
        )
        assert reply.status == 200
    assert sorted((stats(openai_url)["requests"], stats(azure_url)["requests"])) == [0, 6]


async def test_a_stream_holds_its_share_of_load_until_it_closes(group: Any) -> None:
    upstream = group()
    pool = upstream.deployments  # type: ignore[attr-defined]
    stream = await upstream.open_stream(call("long #chunks=3", stream=True))
    assert sorted(d.in_flight for d in pool.all) == [0, 1]
    assert b"w2" in b"".join([chunk async for chunk in stream.chunks()])
    await stream.aclose()
    await stream.aclose()  # once only
    refused = await upstream.open_stream(call("no #status=400", stream=True))
    assert refused.status == 400
    assert [d.in_flight for d in pool.all] == [0, 0]


async def test_a_broken_stream_cools_its_deployment_not_the_model(group: Any) -> None:
    upstream = group(azure={"weight": 1e-6})
    pool = upstream.deployments  # type: ignore[attr-defined]
    with pytest.raises(UpstreamBroken):
        await read_stream(upstream, call("cut #chunks=5 #cut=2", stream=True))
    assert pool.all[1].down_until > time.monotonic() and pool.all[0].down_until == 0
    assert upstream.info.circuit == "closed"  # Azure's deployment can still take requests


def test_the_documented_example_is_a_valid_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).parents[2] / "docs" / "backends.md").read_text()
    example = next(b for b in text.split("```toml")[1:] if "[[models.deployments]]" in b)
    spec = msgspec.convert(tomllib.loads(example.split("```")[0]), CatalogFile)
    monkeypatch.setenv("AZURE_EU_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    live = Catalog(spec).models["gpt-4o"].live_deployments
    assert [(d.label, d.provider, d.weight) for d in live] == [
        ("eu", "azure", 3),
        ("openai", "openai", 1),
    ]


async def _fresh_minute(redis: Any) -> None:
    """No counts left from other tests, and not so near a minute's end that the window turns
    over during the test (the limits count in Redis's own minutes)."""
    seconds = int((await redis.time())[0])
    if seconds % 60 > 54:
        await asyncio.sleep(61 - seconds % 60)
    keys = [k async for k in redis.scan_iter("ty:deployment:*")]
    if keys:
        await redis.delete(*keys)


def _counted(content: str, tokens: int = 10) -> UpstreamCall:
    c = call(content)
    return UpstreamCall(c.path, c.body, c.headers, tokens=tokens)


async def test_a_deployment_at_its_rpm_is_passed_over_by_every_gateway(
    group: Any, redis: Any, openai_url: str, azure_url: str
) -> None:
    """Azure's deployment takes two requests a minute (its quota); the rest go to OpenAI's before
    Azure could answer 429, and a second gateway sees the same counts."""
    await _fresh_minute(redis)
    upstream = group(azure={"rpm": 2}, openai={"weight": 1e-6})
    for i in range(5):
        assert (await upstream.complete(_counted(f"hi {i} #chunks=1"))).status == 200
    assert (stats(azure_url)["requests"], stats(openai_url)["requests"]) == (2, 3)
    other_gateway = group(azure={"rpm": 2}, openai={"weight": 1e-6})
    assert (await other_gateway.complete(_counted("again #chunks=1"))).status == 200
    assert (stats(azure_url)["requests"], stats(openai_url)["requests"]) == (2, 4)


async def test_tokens_per_minute_count_the_prompt_and_the_cap(
    group: Any, redis: Any, openai_url: str, azure_url: str
) -> None:
    await _fresh_minute(redis)
    upstream = group(azure={"tpm": 1000}, openai={"weight": 1e-6})
    # a request larger than the whole limit still goes in a fresh minute (else it never could)
    assert (await upstream.complete(_counted("big #chunks=1", tokens=5000))).status == 200
    assert (await upstream.complete(_counted("small #chunks=1", tokens=10))).status == 200
    assert (stats(azure_url)["requests"], stats(openai_url)["requests"]) == (1, 1)


async def test_every_deployment_full_is_a_rate_limit_until_the_next_minute(
    group: Any, redis: Any, openai_url: str, azure_url: str
) -> None:
    await _fresh_minute(redis)
    upstream = group(azure={"rpm": 1}, openai={"rpm": 1})
    for i in range(2):
        assert (await upstream.complete(_counted(f"hi {i} #chunks=1"))).status == 200
    with pytest.raises(BackendUnavailable) as full:
        await upstream.complete(_counted("one more"))
    assert full.value.status == 429 and full.value.code == "upstream_rate_limited"
    assert full.value.retry_after is not None and 1 <= full.value.retry_after <= 60
    assert stats(azure_url)["requests"] + stats(openai_url)["requests"] == 2  # nothing sent
    assert upstream.info.circuit == "closed"  # a limit of ours, not the model failing
