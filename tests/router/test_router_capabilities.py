"""Capability flags and the field table: auto, fallbacks and named models against what a request
asks (backends/fields.py, router/policy.py)."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from tokenyard.backends.fields import FIELDS, Supports, ask_of, markdown_table, refusal
from tokenyard.router.catalog import DEFAULT_CATALOG, Catalog
from tokenyard.router.policy import AUTO, Router, Unsupported, prefix_text

CATALOG = """
[auto]
strong_capability = 3

[[models]]
id = "tiny"
provider = "self-hosted"
base_urls = ["http://127.0.0.1:1"]
price = { input = 0.01, output = 0.02 }
max_context = 2048
fallbacks = ["mini", "claude"]

[[models]]
id = "mini"
provider = "openai"
base_urls = ["http://127.0.0.1:2/v1"]
api_key_env = "TEST_CAPS_KEY"
price = { input = 0.15, output = 0.6 }
supports = { tools = true, structured_outputs = true, logprobs = true, image_input = true }
fallbacks = ["claude"]

[[models]]
id = "claude"
provider = "anthropic"
base_urls = ["http://127.0.0.1:3"]
api_key_env = "TEST_CAPS_KEY"
price = { input = 3.0, output = 15.0 }
capability = 3
supports = { tools = true, image_input = true }
"""

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@dataclass(frozen=True)
class Team:
    models: tuple[str, ...] = ()
    auto_threshold: float | None = 2.0  # never escalate: auto picks the cheapest able model
    strong_share: float | None = None
    auto_quality: float | None = None
    deployment_tags: frozenset[str] = frozenset()


class NoScorer:
    def route_score(self, prompt: str) -> object:
        return type("S", (), {"score": 0.0, "confidence": 1.0, "projected": ()})()

    def features(self, *args: object) -> None:
        return None


@pytest.fixture
def router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Router:
    monkeypatch.setenv("TEST_CAPS_KEY", "k")
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    return Router(Catalog.load(path), NoScorer())  # type: ignore[arg-type]


def chat(**fields: object) -> dict:
    return {"model": "x", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_auto_sends_a_tools_request_only_to_models_with_the_flag(router: Router) -> None:
    assert router.route(AUTO, chat(), Team(), "interactive").candidates[0] == "tiny"
    route = router.route(AUTO, chat(tools=TOOLS), Team(), "interactive")
    assert "tiny" not in route.candidates and route.candidates[0] == "mini"
    route = router.route(AUTO, chat(response_format={"type": "json_object"}), Team(), "batch")
    assert route.candidates == ("mini",)  # neither the engine model nor claude declares it


def test_fallbacks_skip_models_that_cannot_honour_the_request(router: Router) -> None:
    assert router.route("tiny", chat(), Team(), "interactive").candidates == (
        "tiny",
        "mini",
        "claude",
    )
    route = router.route("mini", chat(logprobs=True), Team(), "interactive")
    assert route.candidates == ("mini",)  # claude has no logprobs
    # the prompt does not fit tiny's 2048 tokens: auto starts past it
    assert router.route(AUTO, chat(), Team(), "interactive", prompt_tokens=4000).candidates == (
        "mini",
        "claude",
    )


def test_a_named_model_without_the_capability_names_the_field(router: Router) -> None:
    with pytest.raises(Unsupported) as tools:
        router.route("tiny", chat(tools=TOOLS, tool_choice="auto"), Team(), "interactive")
    assert tools.value.refusal.param == "tools"
    assert tools.value.refusal.code == "unsupported_parameter"
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    with pytest.raises(Unsupported) as parts:
        router.route("tiny", chat(messages=[{"role": "user", "content": image}]), Team(), "batch")
    assert parts.value.refusal.param == "messages"
    with pytest.raises(Unsupported) as seed:
        router.route("claude", chat(seed=3), Team(), "interactive")
    assert seed.value.refusal.param == "seed"
    # no model this team may use can: the cheapest says why
    with pytest.raises(Unsupported) as auto:
        router.route(AUTO, chat(tools=TOOLS), Team(models=("tiny",)), "interactive")
    assert auto.value.refusal.param == "tools"


def test_values_that_ask_for_nothing_are_never_refused() -> None:
    inert = chat(
        n=1,
        logprobs=False,
        service_tier="auto",
        logit_bias={},
        response_format={"type": "text"},
        store=False,
        presence_penalty=0.0,
        parallel_tool_calls=True,
        modalities=["text"],
    )
    assert ask_of(inert).fields == ("model", "messages")
    # legacy logprobs=0 asks for the sampled token's logprob: not "false"
    assert "logprobs" in ask_of({"prompt": "x", "logprobs": 0}).fields
    legacy = {"model": "x", "prompt": "x", "echo": True, "suffix": "!", "best_of": 2}
    for honoured in ("echo", "best_of"):
        asked = ask_of({k: legacy[k] for k in ("model", "prompt", honoured)})
        assert refusal(asked, "m", "self-hosted", Supports()) is None  # the engine's own
    for field in ("suffix",):
        found = refusal(
            ask_of({k: legacy[k] for k in ("model", "prompt", field)}),
            "m",
            "self-hosted",
            Supports(logprobs=True),
        )
        assert found is not None and found.param == field
        assert refusal(ask_of(legacy), "m", "openai", Supports()) is None  # passed through


def test_every_openai_field_has_a_treatment_for_every_backend_kind() -> None:
    for name, rule in FIELDS.items():
        assert len(rule.treatment) == 5, name
        assert rule.endpoints, name
    # fields once accepted and dropped are in the table, refused by the engine or Anthropic
    for name in ("logit_bias", "suffix", "best_of", "service_tier", "echo"):
        assert "refused" in FIELDS[name].treatment, name
    # vLLM's fields that shape the answer: never dropped by a commercial API unread
    for name in ("structured_outputs", "guided_choice", "guided_regex", "prompt_logprobs"):
        assert FIELDS[name].by("self-hosted") == "honoured", name
        for commercial in ("openai", "anthropic", "gemini", "converse"):
            assert FIELDS[name].by(commercial) == "refused", (name, commercial)
    able = Supports(structured_outputs=True, logprobs=True)
    asked = ask_of({"messages": [], "guided_choice": ["a", "b"]})
    assert refusal(asked, "m", "self-hosted", able) is None
    found = refusal(asked, "gpt", "openai", able)
    assert found is not None and found.param == "guided_choice"


def test_the_docs_show_the_table_as_the_code_has_it() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    assert markdown_table() in docs


def test_prompt_cache_key_picks_the_replica_group() -> None:
    assert prefix_text(chat(prompt_cache_key="team-a-agent")) == "team-a-agent"
    assert prefix_text(chat()) == "hi"


def test_shipped_catalog_declares_the_engine_model_able_to_call_tools() -> None:
    catalog = Catalog.load(DEFAULT_CATALOG)
    smollm2 = catalog.models["smollm2"].supports
    assert smollm2.tools and smollm2.structured_outputs and not smollm2.image_input


def test_anthropic_honours_the_end_user_ids_the_table_says_it_does() -> None:
    from tokenyard.backends.anthropic_wire import messages_request

    body = {"messages": [{"role": "user", "content": "hi"}], "safety_identifier": "s-1"}
    assert messages_request(body, "claude")["metadata"] == {"user_id": "s-1"}
