"""Routing through the gateway: model="auto" by the classifier and the team's threshold or quality
bar, overflow when the cheap model's engine is saturated, fallback when it is down, the served
model reported."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import (
    HERE,
    Process,
    free_port,
    reservations,
    upstream_stats,
    wait_until,
)
from tokenyard.gateway.quotas import platform_model_rpm, platform_model_tpm
from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.tenancy import keys

EASY = "hi! how are you today?"
HARD = (
    "A uniform solid sphere of mass M and radius R rolls without slipping down an incline of "
    "angle theta. Derive its linear acceleration and the minimum coefficient of static friction "
    "required. Which of the following is correct? (A) 5/7 g sin(theta) (B) 3/5 g sin(theta) "
    "(C) 2/3 g sin(theta) (D) g sin(theta)"
)


def _catalog(path: Path, limits: str = "") -> Path:
    """The two models; `limits`: TOML lines for the strong one (every team's rpm, tpm)."""
    path.write_text(
        """
[auto]
strong_capability = 3

[[models]]
id = "cheap"
provider = "self-hosted"
price = { input = 0.02, output = 0.05 }
capability = 1
quality_reference = "mistralai/mistral-7b-chat"
fallbacks = ["strong"]

[[models]]
id = "strong"
provider = "self-hosted"
price = { input = 3.0, output = 15.0 }
capability = 3
quality_reference = "gpt-4-1106-preview"
"""
        + limits
    )
    return path


@contextmanager
def fake_engines(logs: Path, windows: dict[str, int]) -> Iterator[dict[str, str]]:
    """A fake engine per model, each with its context window; their URLs, once all are up."""
    urls, procs = {}, []
    for name, window in windows.items():
        port = free_port()
        command = [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(port)]
        command += ["--model", name, "--max-model-len", str(window)]
        procs.append(Process(command, {}, logs / f"{name}.log"))
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for url in urls.values():
            wait_until(lambda u=url: httpx.get(u + "/health").status_code == 200, 20, "fake engine")
        yield urls
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two fake engines, one per model."""
    with fake_engines(tmp_path_factory.mktemp("engines"), {"cheap": 2048, "strong": 2048}) as urls:
        yield urls


@pytest.fixture
def routed(start_gateway: Any, engines: dict[str, str], tmp_path: Path) -> Any:
    spec = ",".join(f"{name}={url}" for name, url in engines.items())
    for url in engines.values():
        httpx.post(url + "/control", json={"waiting": 0})
    return start_gateway(
        catalog=str(_catalog(tmp_path / "catalog.toml")),
        engine_urls=spec,
        gateway_max_upstream_waiting="4",
    )


def _ask(client: openai.OpenAI, model: str, text: str) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text + " #chunks=2"}], max_tokens=4
    )


def test_auto_routes_by_score_and_threshold(routed: Any, team: Any, engines: dict) -> None:
    classifier = ComplexityClassifier.load()
    easy, hard = classifier.score(EASY + " #chunks=2"), classifier.score(HARD + " #chunks=2")
    assert easy < hard
    _, key = team(auto_threshold=(easy + hard) / 2)
    client = routed.client(key)
    low = _ask(client, "auto", EASY)
    assert low.headers["x-tokenyard-model"] == "cheap"
    assert low.headers["x-tokenyard-route"] == "weak"
    assert float(low.headers["x-tokenyard-score"]) == pytest.approx(easy, abs=1e-4)
    assert upstream_stats(engines["cheap"])["last_body"]["model"] == "cheap"
    high = _ask(client, "auto", HARD)
    assert high.headers["x-tokenyard-model"] == "strong"
    assert high.headers["x-tokenyard-route"] == "strong"
    assert upstream_stats(engines["strong"])["last_body"]["model"] == "strong"
    # a team that wants everything on the strong model, and one that wants nothing there
    _, everything = team(strong_share=1.0)
    assert _ask(routed.client(everything), "auto", EASY).headers["x-tokenyard-model"] == "strong"
    _, nothing = team(strong_share=0.0)
    assert _ask(routed.client(nothing), "auto", HARD).headers["x-tokenyard-model"] == "cheap"
    metrics = httpx.get(routed.url + "/metrics").text
    assert 'tokenyard_router_decisions_total{asked="auto",decision="strong"}' in metrics
    assert 'tokenyard_router_decisions_total{asked="auto",decision="weak"}' in metrics


def test_a_team_quality_bar_picks_the_cheapest_model_predicted_to_clear_it(
    routed: Any, team: Any
) -> None:
    classifier = ComplexityClassifier.load()
    score = classifier.score(HARD + " #chunks=2")
    cheap = float(classifier.quality_curves["mistralai/mistral-7b-chat"].predict(score))
    strong = float(classifier.quality_curves["gpt-4-1106-preview"].predict(score))
    assert cheap + 1e-3 < strong
    for bar, served, predicted in ((cheap, "cheap", cheap), (strong, "strong", strong)):
        _, key = team(auto_quality=bar - 1e-6)  # a bar just under the model's prediction
        reply = _ask(routed.client(key), "auto", HARD)
        assert reply.headers["x-tokenyard-model"] == served
        assert float(reply.headers["x-tokenyard-predicted-quality"]) == pytest.approx(
            predicted, abs=1e-3
        )
    # a team without a bar is routed by the threshold, and told no prediction
    _, key = team(strong_share=0.0)
    reply = _ask(routed.client(key), "auto", HARD)
    assert reply.headers["x-tokenyard-model"] == "cheap"
    assert "x-tokenyard-predicted-quality" not in reply.headers


def test_saturated_engine_overflows_to_the_fallback(routed: Any, team: Any, engines: dict) -> None:
    _, key = team()
    client = routed.client(key)
    assert _ask(client, "cheap", EASY).headers["x-tokenyard-model"] == "cheap"
    httpx.post(engines["cheap"] + "/control", json={"waiting": 10})
    # the gateway polls /load every second
    wait_until(
        lambda: _ask(client, "cheap", EASY).headers["x-tokenyard-model"] == "strong", 5, "overflow"
    )
    reply = _ask(client, "cheap", EASY)
    assert reply.headers["x-tokenyard-route"] == "direct"
    assert reply.parse().choices[0].message.content
    metrics = httpx.get(routed.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="cheap",reason="saturated"}' in metrics
    # both saturated: refused with Retry-After, not queued
    httpx.post(engines["strong"] + "/control", json={"waiting": 10})
    wait_until(lambda: _ask_status(client) == 503, 5, "both saturated")
    with pytest.raises(openai.APIStatusError) as err:
        _ask(client, "cheap", EASY)
    assert err.value.code == "upstream_saturated"
    assert err.value.response.headers["retry-after"] == "1"


def _ask_status(client: openai.OpenAI) -> int:
    try:
        return _ask(client, "cheap", EASY).http_response.status_code
    except openai.APIStatusError as exc:
        return exc.status_code


def test_down_engine_falls_back_and_models_lists_the_catalog(
    start_gateway: Any, team: Any, engines: dict, tmp_path: Path
) -> None:
    httpx.post(engines["strong"] + "/control", json={"waiting": 0})
    dead = f"http://127.0.0.1:{free_port()}"
    gw = start_gateway(
        catalog=str(_catalog(tmp_path / "catalog.toml")),
        engine_urls=f"cheap={dead},strong={engines['strong']}",
    )
    _, key = team()
    client = gw.client(key)
    reply = _ask(client, "cheap", EASY)
    assert reply.headers["x-tokenyard-model"] == "strong"
    cards = {m.id: m.model_extra for m in client.models.list().data}
    assert set(cards) == {"cheap", "strong", "auto"}
    assert cards["cheap"]["ready"] is False and cards["strong"]["ready"] is True
    assert cards["cheap"]["fallbacks"] == ["strong"]
    assert cards["strong"]["pricing"] == {
        "input": 3.0,
        "cached_input": 0.0,
        "output": 15.0,
        "cache_write_input": 0.0,
    }
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="cheap",reason="down"}' in metrics


def test_requests_sharing_a_system_prompt_meet_on_one_replica(
    start_gateway: Any, team: Any, engines: dict, tmp_path: Path
) -> None:
    """Prefix affinity through the gateway: it hands the backend the prompt's start, so requests
    with one system prompt land on the replica that has it cached."""
    urls = list(engines.values())
    for url in urls:
        httpx.post(url + "/control", json={"waiting": 0})
    gw = start_gateway(
        catalog=str(_catalog(tmp_path / "catalog.toml")),
        engine_urls=",".join(f"cheap={url}" for url in urls),  # two replicas of one model
    )
    _, key = team()
    client = gw.client(key)
    before = [upstream_stats(url)["requests"] for url in urls]
    for system in ("You are a terse pirate.", "You answer in French."):
        for i in range(4):
            client.chat.completions.create(
                model="cheap",
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"question {i} #chunks=1"},
                ],
                max_tokens=2,
            )
        after = [upstream_stats(url)["requests"] for url in urls]
        assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 4]
        before = after


def test_a_teams_limit_on_a_model_overflows_to_its_fallback_then_refuses(
    routed: Any, team: Any
) -> None:
    """A team's own requests per minute on single models, beside its overall ones: past the
    cheap model's, its fallback takes the team's requests (an overflow, counted); with the
    fallback's spent too, a 429 names the model first chosen. x-ratelimit-* show the model's
    bucket where it has less left than the team's."""
    _, key = team(rpm=100, model_limits={"cheap": {"rpm": 2}, "strong": {"rpm": 1}})
    client = routed.client(key)
    served = [_ask(client, "cheap", EASY).headers for _ in range(3)]
    assert [h["x-tokenyard-model"] for h in served] == ["cheap", "cheap", "strong"]
    assert [h["x-ratelimit-limit-requests"] for h in served] == ["2", "2", "1"]
    assert [h["x-ratelimit-remaining-requests"] for h in served] == ["1", "0", "0"]
    for model in ("cheap", "strong"):
        with pytest.raises(openai.RateLimitError) as err:
            _ask(client, model, EASY)
        assert err.value.code == "model_requests_per_minute"
        assert f"on model {model!r}" in err.value.message
        assert 28 <= int(err.value.response.headers["retry-after"]) <= 60
    metrics = httpx.get(routed.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="cheap",reason="team_model_limit"}' in metrics
    # another team is not held to this one's limits
    _, other = team()
    assert _ask(routed.client(other), "strong", EASY).headers["x-tokenyard-model"] == "strong"


def test_a_keys_own_limit_on_a_model_overflows_then_refuses_and_binds_only_that_key(
    routed: Any, team: Any, sql: Any
) -> None:
    """A key's own requests per minute on single models (LiteLLM's model_rpm_limit on a key),
    beside its team's: past the cheap model's the fallback takes the key's requests (an overflow,
    reason key_model_limit); with the fallback's spent too, a 429 naming the key and the model.
    The team's other keys are not held to it, and an update takes effect on the key's next
    request."""
    name, other = team(rpm=100)
    limited = keys.create_key(
        sql, name, limits={"model_limits": {"cheap": {"rpm": 1}, "strong": {"rpm": 1}}}
    )
    client = routed.client(limited.key)
    served = [_ask(client, "cheap", EASY).headers for _ in range(2)]
    assert [h["x-tokenyard-model"] for h in served] == ["cheap", "strong"]
    assert [h["x-ratelimit-remaining-requests"] for h in served] == ["0", "0"]
    with pytest.raises(openai.RateLimitError) as err:
        _ask(client, "cheap", EASY)
    assert err.value.code == "key_model_requests_per_minute"
    assert f"key {limited.prefix}" in err.value.message and "on model 'cheap'" in err.value.message
    metrics = httpx.get(routed.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="cheap",reason="key_model_limit"}' in metrics
    # the team's other key is not held to this key's limits
    assert _ask(routed.client(other), "cheap", EASY).headers["x-tokenyard-model"] == "cheap"
    # cleared, the key is held to its team's limits alone (the gateway caches keys ~1 s)
    keys.update_key(sql, limited.prefix, model_limits=None)
    wait_until(
        lambda: _ask(client, "cheap", EASY).headers["x-tokenyard-model"] == "cheap",
        5,
        "the key's limits cleared",
    )


def test_a_teams_tokens_per_minute_on_a_model_reserve_max_tokens_and_refund(
    routed: Any, team: Any
) -> None:
    _, key = team(model_limits={"strong": {"tpm": 300}})
    client = routed.client(key)

    def ask(model: str, max_tokens: int) -> Any:
        return client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": "hi #chunks=2"}],
            max_tokens=max_tokens,
        )

    # each reserves its prompt + 200 of the 300: the second fits only once the first's unused
    # tokens came back
    for _ in range(2):
        assert ask("strong", 200).headers["x-ratelimit-limit-tokens"] == "300"
    with pytest.raises(openai.RateLimitError) as err:
        ask("strong", 400)  # can never fit
    assert err.value.code == "model_tokens_per_minute"
    assert err.value.response.headers["retry-after"] == "60"
    # the cheap model has no limit of its own for this team
    assert "x-ratelimit-limit-tokens" not in ask("cheap", 400).headers


def test_every_teams_limit_on_a_model_is_shared_and_overflows_too(
    start_gateway: Any, engines: dict[str, str], team: Any, tmp_path: Path, redis_server: Any
) -> None:
    """A model's limits in the catalog (a provider's limits on the platform's account) hold every
    team's requests together: past them the model's fallback takes requests, else 503 naming the
    model; no team sees them in its x-ratelimit-* headers."""
    catalog = _catalog(tmp_path / "catalog.toml", "rpm = 2\n")
    strong_then_cheap = catalog.read_text().replace(
        'quality_reference = "gpt-4-1106-preview"',
        'quality_reference = "gpt-4-1106-preview"\nfallbacks = ["cheap"]',
    )
    catalog.write_text(strong_then_cheap)
    spec = ",".join(f"{name}={url}" for name, url in engines.items())
    buckets = (platform_model_rpm("strong"), platform_model_tpm("strong"))
    redis_server.client().delete(*buckets)  # every gateway of the session shares them
    gateway = start_gateway(catalog=str(catalog), engine_urls=spec)
    (_, first), (_, second) = team(), team()
    served = [_ask(gateway.client(key), "strong", EASY).headers for key in (first, second, first)]
    assert [h["x-tokenyard-model"] for h in served] == ["strong", "strong", "cheap"]
    assert "x-ratelimit-limit-requests" not in served[0]
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="strong",reason="platform_model_limit"}' in (
        metrics
    )
    # with nowhere to go: a 503 naming the model, and when to come back
    alone = tmp_path / "alone.toml"
    alone.write_text(_catalog(tmp_path / "plain.toml", "rpm = 1\n").read_text())
    redis_server.client().delete(*buckets)
    gateway = start_gateway(catalog=str(alone), engine_urls=spec)
    _, key = team()
    assert _ask(gateway.client(key), "strong", EASY).headers["x-tokenyard-model"] == "strong"
    with pytest.raises(openai.InternalServerError) as err:
        _ask(gateway.client(key).with_options(max_retries=0), "strong", EASY)
    assert err.value.status_code == 503
    assert err.value.code == "platform_model_requests_per_minute"
    assert "on model 'strong'" in err.value.message
    assert 50 <= int(err.value.response.headers["retry-after"]) <= 60


def test_a_prompt_too_long_for_its_model_goes_to_its_context_fallback(
    start_gateway: Any, team: Any, redis_server: Any, tmp_path: Path
) -> None:
    """LiteLLM's context_window_fallbacks: a prompt the model's window cannot hold goes to the
    wider model, whether the gateway's estimate says so (nothing is sent to the narrow one) or
    the upstream's own refusal does (the estimate missed; streamed or not, the client sees the
    wider model's answer). A team that may not use the wider model gets the refusal."""
    with fake_engines(tmp_path, {"narrow": 64, "wide": 4096}) as urls:
        path = tmp_path / "catalog.toml"
        path.write_text(
            '[[models]]\nid = "narrow"\nprovider = "self-hosted"\ncontext_fallbacks = ["wide"]\n'
            '[[models]]\nid = "wide"\nprovider = "self-hosted"\n'
        )
        spec = ",".join(f"{name}={url}" for name, url in urls.items())
        gw = start_gateway(catalog=str(path), engine_urls=spec)
        name, key = team()
        client = gw.client(key)
        assert _ask(client, "narrow", EASY).headers["x-tokenyard-model"] == "narrow"
        card = client.models.retrieve("narrow").model_extra or {}
        assert card["context_fallbacks"] == ["wide"] and card["fallbacks"] == []
        sent = upstream_stats(urls["narrow"])["requests"]
        long = " ".join(["elephants"] * 40)  # ~100 tokens by its bytes: over 64
        reply = _ask(client, "narrow", long)
        assert reply.headers["x-tokenyard-model"] == "wide"
        assert reply.parse().model == "wide"
        assert upstream_stats(urls["narrow"])["requests"] == sent
        dense = " ".join(["a"] * 80)  # ~60 tokens by its bytes, 81 words (tokens) upstream
        for stream in (False, True):
            reply = client.chat.completions.with_raw_response.create(
                model="narrow",
                messages=[{"role": "user", "content": dense + " #chunks=2"}],
                max_tokens=4,
                stream=stream,
            )
            assert reply.headers["x-tokenyard-model"] == "wide"
            body = reply.parse()
            text = (
                "".join(c.choices[0].delta.content or "" for c in body if c.choices)
                if stream
                else body.choices[0].message.content
            )
            assert text == "tok tok "
        assert upstream_stats(urls["narrow"])["requests"] == sent + 2  # refused there, twice
        metrics = httpx.get(gw.url + "/metrics").text
        assert (
            'tokenyard_router_overflows_total{model="narrow",reason="context_window"} 3.0'
            in metrics
        )
        r = redis_server.client()
        wait_until(lambda: reservations(r, name)["leases"] == 0, 5, "leases released")
        # a team that may not use the wide model: the narrow model's refusal, as without fallbacks
        _, only = team(models=["narrow"])
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(gw.client(only), "narrow", long)
        assert refused.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(gw.client(only), "narrow", dense)
        assert refused.value.code == "context_length_exceeded"
        assert "maximum context length is 64" in refused.value.message
