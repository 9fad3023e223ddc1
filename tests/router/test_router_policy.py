"""The catalog and the routing policy: chains, team restrictions, tiers, auto's two classes,
thresholds from shares, the cost-aware choice under a quality bar, saturation."""

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tokenyard.core.settings import Settings
from tokenyard.router.catalog import DEFAULT_CATALOG, Catalog, CatalogError, Price, load_catalog
from tokenyard.router.classifier import ComplexityClassifier
from tokenyard.router.policy import (
    AUTO,
    NoRoute,
    Router,
    Scorer,
    prefix_text,
    prompt_text,
)
from tokenyard.router.quality import QualityCurve
from tokenyard.router.scorer import RouteScore

CATALOG = """
[auto]
strong_capability = 3
strong_share = 0.25

[[models]]
id = "tiny"
provider = "self-hosted"
base_urls = ["http://127.0.0.1:1"]
price = { input = 0.01, output = 0.02 }
capability = 1
quality_reference = "ref-tiny"
fallbacks = ["mini"]

[[models]]
id = "mini"
provider = "openai"
base_urls = ["http://127.0.0.1:2/v1"]
api_key_env = "TEST_POLICY_OPENAI_KEY"
price = { input = 0.15, cached_input = 0.075, output = 0.6 }
capability = 2
quality_reference = "ref-mini"
tiers = ["interactive"]
fallbacks = ["tiny"]

[[models]]
id = "big"
provider = "anthropic"
base_urls = ["http://127.0.0.1:3"]
api_key_env = "TEST_POLICY_ANTHROPIC_KEY"
price = { input = 3.0, cached_input = 0.3, output = 15.0 }
capability = 3
quality_reference = "ref-big"
fallbacks = ["bigger", "mini"]

[[models]]
id = "bigger"
provider = "openai"
base_urls = ["http://127.0.0.1:2/v1"]
api_key_env = "TEST_POLICY_OPENAI_KEY"
price = { input = 5.0, output = 20.0 }
capability = 3
"""


@dataclass(frozen=True)
class Team:
    models: tuple[str, ...] = ()
    auto_threshold: float | None = None
    strong_share: float | None = None
    auto_quality: float | None = None
    deployment_tags: frozenset[str] = frozenset()


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Catalog:
    monkeypatch.setenv("TEST_POLICY_OPENAI_KEY", "sk-test")
    monkeypatch.setenv("TEST_POLICY_ANTHROPIC_KEY", "sk-ant-test")
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    return Catalog.load(path)


@pytest.fixture(scope="module")
def classifier() -> ComplexityClassifier:
    return ComplexityClassifier.load()


def chat(text: str) -> dict:
    return {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    }


EASY = "hi! how are you today?"
HARD = (
    "A uniform solid sphere of mass M and radius R rolls without slipping down an incline of "
    "angle theta. Derive its linear acceleration and the minimum coefficient of static friction "
    "required, then compare with a thin spherical shell. Which of the following is correct? "
    "(A) 5/7 g sin(theta) (B) 3/5 g sin(theta) (C) 2/3 g sin(theta) (D) g sin(theta)"
)


def test_shipped_catalog_loads_and_commercial_models_without_keys_are_unconfigured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    catalog = load_catalog(Settings(engine_urls="", catalog=""))
    by_provider = {m.provider for m in catalog.models.values()}
    assert by_provider == {"self-hosted", "openai", "anthropic", "gemini"}
    configured = {m.id for m in catalog.models.values() if m.configured}
    # the local engine and embeddings server fill in the self-hosted replicas
    assert configured == {"smollm2", "all-minilm-l6-v2"}
    assert catalog.models["smollm2"].base_urls == ("http://127.0.0.1:8100",)
    assert catalog.models["all-minilm-l6-v2"].base_urls == ("http://127.0.0.1:8200",)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert Catalog.load(DEFAULT_CATALOG).models["gpt-4o"].configured


def test_engine_urls_name_replicas_and_add_models() -> None:
    settings = Settings(engine_urls="http://a:1,smollm2=http://b:2,other=http://c:3")
    catalog = load_catalog(settings)
    assert catalog.models["smollm2"].base_urls == ("http://a:1", "http://b:2")
    assert catalog.models["other"].provider == "self-hosted"
    assert catalog.models["other"].base_urls == ("http://c:3",)


# two models, the second's table open last (a field added after it is the second's)
TWO = '[[models]]\nid = "a"\nprovider = "openai"\n[[models]]\nid = "b"\nprovider = "openai"\n'


def test_an_alias_is_the_model_it_names(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(TWO + 'aliases = ["gpt-3.5-turbo", "b-2024"]\n')
    catalog = Catalog.load(path)
    assert catalog.resolve("gpt-3.5-turbo") == catalog.resolve("b-2024") == "b"
    assert catalog.resolve("a") == "a" and catalog.resolve("nope") == "nope"


def test_catalog_rejects_bad_files(tmp_path: Path) -> None:
    bad = {
        "unknown fallback": '[[models]]\nid = "a"\nprovider = "openai"\nfallbacks = ["zz"]\n',
        "bad provider": '[[models]]\nid = "a"\nprovider = "watsonx"\n',
        "duplicate id": '[[models]]\nid = "a"\nprovider = "openai"\n' * 2,
        "auto as a model": '[[models]]\nid = "auto"\nprovider = "openai"\n',
        "unknown field": '[[models]]\nid = "a"\nprovider = "openai"\nprize = 3\n',
        "not toml": "[[models]\n",
        "alias naming a model": f'{TWO}aliases = ["b"]\n',
        "alias of two models": TWO.replace('"a"\n', '"a"\naliases = ["x"]\n') + 'aliases = ["x"]\n',
        "alias auto": '[[models]]\nid = "a"\nprovider = "openai"\naliases = ["auto"]\n',
        "a chat model ranking": '[[models]]\nid = "a"\nprovider = "openai"\nrerank = true\n',
        "unknown context fallback": f'{TWO}context_fallbacks = ["zz"]\n',
        "itself as context fallback": f'{TWO}context_fallbacks = ["b"]\n',
        "audio off OpenAI's API": '[[models]]\nid = "a"\nprovider = "anthropic"\nkind = "speech"\n',
    }
    for what, text in bad.items():
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(CatalogError):
            Catalog.load(path)
            pytest.fail(what)


def test_price_counts_cached_tokens_at_their_own_rate() -> None:
    price = Price(input=2.5, cached_input=1.25, output=10.0)
    # 1,000 prompt tokens of which 400 cached, 200 completion tokens
    expected = (600 * 2.5 + 400 * 1.25 + 200 * 10.0) / 1e6
    assert price.cost(1000, 400, 200) == pytest.approx(expected)


def test_explicit_model_chain_respects_team_and_tier(catalog: Catalog) -> None:
    router = Router(catalog, Scorer(ComplexityClassifier.load))
    route = router.route("big", chat(EASY), Team(), "interactive")
    assert route.candidates == ("big", "bigger", "mini", "tiny")
    assert route.score is None
    # batch: "mini" serves interactive only, so it drops out of the chain
    assert router.route("big", chat(EASY), Team(), "batch").candidates == ("big", "bigger", "tiny")
    # a team restricted to big and tiny never falls back to the others
    team = Team(models=("big", "tiny"))
    assert router.route("big", chat(EASY), team, "interactive").candidates == ("big", "tiny")
    with pytest.raises(NoRoute):
        router.route("bigger", chat(EASY), team, "interactive")
    with pytest.raises(NoRoute):
        router.route("mini", chat(EASY), Team(), "batch")
    with pytest.raises(NoRoute):
        router.route("nope", chat(EASY), Team(), "interactive")


def test_a_team_bound_to_deployment_tags_routes_only_to_models_with_such_a_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deployment_tags`: a model serves the team only where a deployment it can call carries them
    all (a self-hosted model, where the model does): named, in chains and for auto."""
    monkeypatch.setenv("TEST_POLICY_OPENAI_KEY", "sk-test")
    monkeypatch.setenv("TEST_POLICY_ANTHROPIC_KEY", "sk-ant-test")
    path = tmp_path / "c.toml"
    tagged = CATALOG.replace(
        'quality_reference = "ref-tiny"', 'quality_reference = "ref-tiny"\ntags = ["eu", "onprem"]'
    ).replace(
        'id = "bigger"\nprovider = "openai"\nbase_urls = ["http://127.0.0.1:2/v1"]\n'
        'api_key_env = "TEST_POLICY_OPENAI_KEY"',
        'id = "bigger"\nprovider = "openai"\ndeployments = [\n'
        '  { base_url = "http://127.0.0.1:4/v1", api_key_env = "TEST_POLICY_OPENAI_KEY", '
        'tags = ["us"] },\n'
        '  { base_url = "http://127.0.0.1:5/v1", api_key_env = "TEST_EU_KEY", tags = ["eu"] },\n]',
    )
    path.write_text(tagged)
    router = Router(Catalog.load(path), Scorer(ComplexityClassifier.load))
    eu = Team(deployment_tags=frozenset({"eu"}))
    # the EU deployment of "bigger" has no key set: only the self-hosted model is in the EU
    assert router.route("big", chat(EASY), Team(), "interactive").candidates[:2] == (
        "big",
        "bigger",
    )
    with pytest.raises(NoRoute, match="no deployment tagged eu"):
        router.route("big", chat(EASY), eu, "interactive")
    assert router.route("tiny", chat(EASY), eu, "interactive").candidates == ("tiny",)
    assert router.route(AUTO, chat(HARD), eu, "interactive").candidates == ("tiny",)
    monkeypatch.setenv("TEST_EU_KEY", "sk-eu")
    assert router.route("bigger", chat(EASY), eu, "interactive").candidates == ("bigger",)
    both = Team(deployment_tags=frozenset({"eu", "onprem"}))
    assert router.route(AUTO, chat(HARD), both, "interactive").candidates == ("tiny",)


def test_context_fallbacks_are_a_route_apart_held_to_the_team_and_tier(tmp_path: Path) -> None:
    """A model's context fallbacks (with their own fallbacks) are kept beside its chain, not in
    it: load and outages never reach them; only the models the team may use, on its tier, that
    serve the request, a model of the chain included."""
    path = tmp_path / "c.toml"
    wide = 'fallbacks = ["mini"]\ncontext_fallbacks = ["big"]'
    path.write_text(CATALOG.replace('fallbacks = ["mini"]', wide) + "max_context = 1000\n")
    router = Router(Catalog.load(path), Scorer(ComplexityClassifier.load))
    route = router.route("tiny", chat(EASY), Team(), "interactive")
    assert route.candidates == ("tiny", "mini")
    assert route.wider == ("big", "bigger", "mini")  # big's chain, tiny itself left out
    widened = route.widened()
    assert (widened.candidates, widened.wider, widened.asked) == (route.wider, (), "tiny")
    assert router.route("tiny", chat(EASY), Team(models=("tiny", "bigger")), "batch").wider == (
        "bigger",
    )
    assert router.route("tiny", chat(EASY), Team(models=("tiny",)), "interactive").wider == ()
    # one whose window is known too small for the prompt is left out (bigger's: 1,000)
    long = router.route("tiny", chat(EASY), Team(), "interactive", prompt_tokens=5000)
    assert long.wider == ("big", "mini")


def test_auto_sends_easy_prompts_cheap_and_hard_ones_up(
    catalog: Catalog, classifier: ComplexityClassifier
) -> None:
    router = Router(catalog, Scorer(lambda: classifier))
    easy, hard = classifier.score(EASY), classifier.score(HARD)
    assert easy < hard
    team = Team(auto_threshold=(easy + hard) / 2)
    low = router.route(AUTO, chat(EASY), team, "interactive")
    assert (low.candidates[0], low.escalated, low.score) == ("tiny", False, pytest.approx(easy))
    high = router.route(AUTO, chat(HARD), team, "interactive")
    assert high.escalated and high.candidates[0] == "big"  # the cheapest of capability 3
    assert high.candidates[:3] == ("big", "bigger", "mini")
    # the threshold decides: below both scores, everything escalates; above both, nothing does
    assert router.route(AUTO, chat(EASY), Team(auto_threshold=0.0), "interactive").escalated
    assert not router.route(AUTO, chat(HARD), Team(auto_threshold=1.01), "interactive").escalated
    # a team allowed only the cheap model gets it even for hard prompts
    tiny_only = router.route(AUTO, chat(HARD), Team(models=("tiny",), auto_threshold=0.0), "batch")
    assert tiny_only.candidates == ("tiny",)


def test_strong_share_is_calibrated_into_a_threshold(
    catalog: Catalog, classifier: ComplexityClassifier
) -> None:
    router = Router(catalog, Scorer(lambda: classifier))
    prompts = [EASY, HARD, "what is 17 * 23?", "translate 'good morning' to French"] * 3
    for share, expect_any, expect_all in ((0.0, False, False), (1.0, True, True)):
        routes = [
            router.route(AUTO, chat(p), Team(strong_share=share), "interactive") for p in prompts
        ]
        escalated = [r.escalated for r in routes]
        assert any(escalated) is expect_any and all(escalated) is expect_all
    # no team setting: the catalog's default share, through the classifier's calibration curve
    expected = classifier.threshold_for_strong_share(0.25)
    route = router.route(AUTO, chat(HARD), Team(), "interactive")
    assert route.escalated == (classifier.score(HARD) >= expected)


# predicted quality against the score: tiny falls fast as prompts get harder, big barely
CURVES = {
    "ref-tiny": QualityCurve(1.0, -2.0),  # at score 0.2: 0.977, 0.5: 0.731, 0.8: 0.145
    "ref-mini": QualityCurve(2.0, -1.0),  # 0.967, 0.881, 0.649
    "ref-big": QualityCurve(3.0, -0.5),  # 0.976, 0.953, 0.909
}


@dataclass
class FixedScores:
    """A classifier stand-in: each prompt's score is its text ("0.5" scores 0.5)."""

    quality_curves: dict[str, QualityCurve] = field(default_factory=lambda: CURVES)
    version: str = "test"

    def route_score(self, prompt: str) -> RouteScore:
        return RouteScore(float(prompt), 1.0, 0.5, np.zeros(4), 0.0)

    def threshold_for_strong_share(self, share: float) -> float:
        return 1.0 - share


def test_quality_bar_picks_the_cheapest_model_predicted_to_clear_it(catalog: Catalog) -> None:
    router = Router(catalog, Scorer(FixedScores))

    def first(score: str, bar: float) -> tuple[str, bool, float | None]:
        route = router.route(AUTO, chat(score), Team(auto_quality=bar), "interactive")
        return route.candidates[0], route.escalated, route.predicted_quality

    assert first("0.2", 0.9) == ("tiny", False, pytest.approx(0.977, abs=1e-3))
    assert first("0.5", 0.85) == ("mini", False, pytest.approx(0.881, abs=1e-3))
    assert first("0.5", 0.9) == ("big", True, pytest.approx(0.953, abs=1e-3))
    # no model clears 0.95 on a hard prompt: the one predicted best, never "bigger" (no curve)
    assert first("0.8", 0.95) == ("big", True, pytest.approx(0.909, abs=1e-3))
    # the rest of the chosen model's class follows its fallbacks
    route = router.route(AUTO, chat("0.5"), Team(auto_quality=0.85), "interactive")
    assert route.candidates[:2] == ("mini", "tiny") and "bigger" in route.candidates
    # batch: mini serves interactive only, so the cheapest that clears 0.85 there is big
    assert router.route(AUTO, chat("0.5"), Team(auto_quality=0.85), "batch").candidates[0] == "big"
    # a curve fitted on the platform's ratings of a model (by its id) wins over its reference's
    own = Router(catalog, Scorer(lambda: FixedScores(CURVES | {"mini": QualityCurve(5.0, 0.0)})))
    route = own.route(AUTO, chat("0.8"), Team(auto_quality=0.95), "interactive")
    assert route.candidates[0] == "mini" and route.predicted_quality == pytest.approx(
        0.993, abs=1e-3
    )
    # a team whose models have no curve is routed by the threshold instead
    only = router.route(AUTO, chat("0.5"), Team(models=("bigger",), auto_quality=0.9), "batch")
    assert only.candidates == ("bigger",) and only.predicted_quality is None


def test_quality_bar_precedence_team_then_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TEST_POLICY_OPENAI_KEY", "sk-test")
    monkeypatch.setenv("TEST_POLICY_ANTHROPIC_KEY", "sk-ant-test")
    path = tmp_path / "catalog.toml"
    text = CATALOG.replace("strong_share = 0.25", "strong_share = 0.25\nquality_bar = 0.9")
    path.write_text(text.replace('"ref-mini"', '"no-such-model"'))
    router = Router(Catalog.load(path), Scorer(FixedScores))
    # no team setting: the catalog's bar (mini has an unknown reference, so big clears 0.9)
    with caplog.at_level(logging.WARNING, logger="tokenyard.router.policy"):
        default = router.route(AUTO, chat("0.5"), Team(), "interactive")
    assert default.candidates[0] == "big" and default.predicted_quality is not None
    assert "no-such-model" in caplog.text
    # the team's own bar wins over the catalog's
    assert router.route(AUTO, chat("0.5"), Team(auto_quality=0.7), "interactive").candidates[0] == (
        "tiny"
    )
    # a team that set a threshold or a share is routed by it, not by the catalog's bar
    for team in (Team(auto_threshold=0.6), Team(strong_share=0.4)):  # threshold 0.6 both ways
        route = router.route(AUTO, chat("0.5"), team, "interactive")
        assert route.predicted_quality is None and route.candidates[0] == "tiny"
    path.write_text(CATALOG.replace("strong_share = 0.25", "strong_share = 0.25\nquality_bar = 2"))
    with pytest.raises(CatalogError):
        Catalog.load(path)


def test_prompt_text_takes_the_last_user_turn() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "x"}]},
        ]
    }
    assert prompt_text(body) == "second"
    assert prompt_text({"prompt": "complete me"}) == "complete me"
    assert prompt_text({"prompt": [1, 2, 3]}) == ""
    assert prompt_text({"messages": [{"role": "system", "content": "only"}]}) == ""


def test_prefix_text_takes_the_first_message_or_the_prompt() -> None:
    parts = [{"type": "text", "text": "abc"}, {"type": "text", "text": "def"}]
    body = {"messages": [{"role": "system", "content": parts}, {"role": "user", "content": "x"}]}
    assert prefix_text(body) == "abc\ndef"
    assert prefix_text({"prompt": "once upon"}) == "once upon"
    assert prefix_text({"prompt": [1, 2]}) == ""
