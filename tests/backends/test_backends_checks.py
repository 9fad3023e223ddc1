"""Each place a model is served tried once with the smallest real request (backends/checks.py,
`tokenyard models check`, `POST /v1/admin/models/check`): which deployment or replica answers,
and why the others do not, with no retry, no cooldown and nothing for the breaker."""

from typing import Any

import pytest

from tests.backends.conftest import KEY_ENV, control, free_port, stats
from tests.backends.test_backends_deployments import group  # noqa: F401 - a fixture
from tokenyard.backends.registry import Backends
from tokenyard.router.catalog import Catalog, CatalogFile, ModelEntry
from tokenyard.router.upstreams import check_models


async def test_each_deployment_is_tried_once_and_failures_say_why(
    group: Any,  # noqa: F811 - the fixture imported above
    openai_url: str,
    azure_url: str,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    upstream = group()
    checks = await upstream.check("chat")
    assert {(c.at, c.ok, c.status) for c in checks} == {("azure", True, 200), ("openai", True, 200)}
    assert all(c.model == "gpt-4o" and c.latency_ms > 0 and not c.error for c in checks)
    assert stats(openai_url)["last_body"]["max_tokens"] == 1  # the smallest request there is
    control(azure_url, fail_next=1, status=429)
    broken = group(openai={"base_url": dead})
    found = {c.at: c for c in await broken.check("chat")}
    assert (found["azure"].ok, found["azure"].status) == (False, 429)  # asked once: no retry
    assert (found["openai"].ok, found["openai"].status) == (False, None)
    assert "Connect" in found["openai"].error or "connect" in found["openai"].error
    pool = broken.deployments  # type: ignore[attr-defined]
    assert all(d.down_until == 0 for d in pool.all)  # a check cools nothing
    assert broken.info.circuit == "closed"


async def test_a_refusal_names_the_providers_reason(
    build_entry: Any, gemini_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gemini with a wrong key: Google's refusal, in its words, whatever the provider's shape."""
    monkeypatch.setenv(KEY_ENV, "gm-key")
    control(gemini_url, reset=True)
    control(gemini_url, fail_next=1, status=403)
    entry = ModelEntry(
        id="gem",
        provider="gemini",
        upstream_model="gemini-2.5-flash",
        base_urls=(gemini_url + "/v1beta",),
        api_key_env=KEY_ENV,
    )
    (refused,) = await build_entry(entry).check("chat")
    assert (refused.ok, refused.status) == (False, 403) and "refused" in refused.error
    (answered,) = await build_entry(entry).check("chat")
    assert answered.ok and stats(gemini_url)["last_body"]["generationConfig"] == {
        "maxOutputTokens": 1
    }


async def test_every_model_or_those_named_and_engine_replicas(
    build_entry: Any, engines: list[str], openai_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    dead = f"http://127.0.0.1:{free_port()}"
    models = (
        ModelEntry(id="fake", provider="self-hosted", base_urls=(engines[0], dead)),
        ModelEntry(
            id="mini",
            provider="openai",
            base_urls=(openai_url + "/v1",),
            api_key_env=KEY_ENV,
            aliases=("mini-latest",),
        ),
        ModelEntry(
            id="embed",
            provider="openai",
            kind="embedding",
            base_urls=(openai_url + "/v1",),
            api_key_env=KEY_ENV,
        ),
        ModelEntry(  # never checked: the smallest image costs cents
            id="draw",
            provider="openai",
            kind="image",
            base_urls=(openai_url + "/v1",),
            api_key_env=KEY_ENV,
        ),
    )
    catalog = Catalog(CatalogFile(models=models))
    backends = Backends({m.id: build_entry(m) for m in models})
    checks = await check_models(catalog, backends)
    openai_at = "127.0.0.1:" + openai_url.rsplit(":", 1)[1]
    assert {(c.model, c.at, c.ok) for c in checks} == {
        ("fake", engines[0], True),
        ("fake", dead, False),
        ("mini", openai_at, True),
        ("embed", openai_at, False),  # an embedding model is asked to embed (the fake cannot)
    }
    (embed,) = [c for c in checks if c.model == "embed"]
    assert embed.status == 404 and "/v1/embeddings" in embed.error
    named = await check_models(catalog, backends, ["mini-latest"])  # an alias names its model
    assert [c.model for c in named] == ["mini"]
    for not_checked in ("nope", "draw"):
        with pytest.raises(ValueError, match=not_checked):
            await check_models(catalog, backends, [not_checked])
