"""Request fields through the gateway with the official SDK: every field the engine refuses answers
400 unsupported_parameter naming it, before any quota is touched; a model without a capability
refuses what needs it; auto never sends a tools request to a model without the flag."""

import uuid
from typing import Any

import openai
import pytest

from tests.gateway.conftest import Gateway, reservations, upstream_stats
from tokenyard.backends.fields import FIELDS
from tokenyard.tenancy import keys, teams

CHAT = [{"role": "user", "content": "hi #chunks=1"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
# a value that asks for something, for every field the engine refuses
REFUSED_BY_ENGINE = {
    "reasoning_effort": "low",
    "service_tier": "flex",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {},
    "verbosity": "low",
    "moderation": {"categories": ["violence"]},
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"ttl": "1h"},
    "suffix": "!",
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "output_config": {"effort": "low"},
}


@pytest.fixture(scope="module")
def team(sql: Any) -> tuple[str, str]:
    name = "fields-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    return name, keys.create_key(sql, name).key


def test_the_sample_covers_every_field_the_engine_refuses() -> None:
    refused = {n for n, rule in FIELDS.items() if rule.by("self-hosted") == "refused"}
    assert refused == set(REFUSED_BY_ENGINE)


@pytest.mark.parametrize(("field", "value"), sorted(REFUSED_BY_ENGINE.items()))
def test_each_refused_field_answers_400_naming_it(
    capabilities_gw: Gateway, team: tuple[str, str], redis_server: Any, field: str, value: Any
) -> None:
    name, key = team
    client = capabilities_gw.client(key)
    legacy = FIELDS[field].endpoints == ("completion",)
    with pytest.raises(openai.BadRequestError) as refused:
        if legacy:
            client.completions.create(model="fake", prompt="hi", extra_body={field: value})
        else:
            client.chat.completions.create(model="fake", messages=CHAT, extra_body={field: value})
    error = refused.value.body
    assert error["param"] == field and error["code"] == "unsupported_parameter"  # type: ignore[index]
    held = reservations(redis_server.client(), name)
    assert held["leases"] == 0 and held["pages"] == 0


def test_values_that_ask_for_nothing_pass(capabilities_gw: Gateway, team: tuple[str, str]) -> None:
    client = capabilities_gw.client(team[1])
    reply = client.chat.completions.create(
        model="fake",
        messages=CHAT,
        n=1,
        service_tier="auto",
        store=False,
        logprobs=False,
        response_format={"type": "text"},
    )
    assert reply.choices[0].message.content
    honoured = client.completions.create(
        model="fake", prompt="hi #chunks=1", echo=False, best_of=1, logit_bias={"50256": -100}
    )
    assert honoured.choices[0].text


def test_a_predicted_output_reaches_the_engine(
    capabilities_gw: Gateway, team: tuple[str, str], upstream: str
) -> None:
    """`prediction` (OpenAI's Predicted Outputs) is the engine's to honour: it goes through as
    sent."""
    predicted = {"type": "content", "content": "hi there"}
    client = capabilities_gw.client(team[1])
    client.chat.completions.create(model="fake", messages=CHAT, prediction=predicted)  # type: ignore[arg-type]
    assert upstream_stats(upstream)["last_body"]["prediction"] == predicted


def test_vllms_structured_outputs_reach_the_engine(
    capabilities_gw: Gateway, team: tuple[str, str], upstream: str
) -> None:
    client = capabilities_gw.client(team[1])
    for extra in ({"structured_outputs": {"choice": ["a", "b"]}}, {"guided_regex": "[ab]"}):
        client.completions.create(model="fake", prompt="hi #chunks=1", extra_body=extra)
        sent = upstream_stats(upstream)["last_body"]
        assert {k: sent[k] for k in extra} == extra


def test_a_model_without_a_capability_refuses_what_needs_it(
    capabilities_gw: Gateway, team: tuple[str, str]
) -> None:
    client = capabilities_gw.client(team[1])
    cases = {
        "tools": {"tools": TOOLS},
        "tool_choice": {"tool_choice": "none"},
        "response_format": {"response_format": {"type": "json_object"}},
        "logprobs": {"logprobs": True},
        "prompt_logprobs": {"prompt_logprobs": 1},
        "structured_outputs": {"structured_outputs": {"choice": ["a", "b"]}},
        "guided_regex": {"guided_regex": "[ab]"},
        "functions": {"functions": [{"name": "f", "parameters": {"type": "object"}}]},
    }
    for field, extra in cases.items():
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="plain", messages=CHAT, extra_body=extra)
        assert refused.value.body["param"] == field  # type: ignore[index]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as parts:
        client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": [image]}]
        )
    assert parts.value.body["param"] == "messages"  # type: ignore[index]


def test_auto_never_sends_tools_to_a_model_without_the_flag(
    capabilities_gw: Gateway, team: tuple[str, str], upstream: str
) -> None:
    client = capabilities_gw.client(team[1])
    for _ in range(3):
        reply = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=CHAT,
            tools=TOOLS,  # type: ignore[arg-type]
        )
        assert reply.headers["x-tokenyard-model"] == "fake"
        sent = upstream_stats(upstream)["last_body"]
        assert sent["model"] == "fake" and sent["tools"] == TOOLS
    cards = {m.id: m.model_extra for m in client.models.list().data}
    assert cards["fake"]["supports"]["tools"] and not cards["plain"]["supports"]["tools"]
    plain = client.chat.completions.with_raw_response.create(model="auto", messages=CHAT)
    assert plain.headers["x-tokenyard-model"] == "plain"  # without tools: the cheapest
    # a named model's fallbacks are filtered the same way: plain falls back to fake, never the
    # reverse, and a tools request to plain is refused rather than rerouted
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="plain", messages=CHAT, tools=TOOLS)  # type: ignore[arg-type]


def test_best_of_holds_every_candidate_in_the_quotas(capabilities_gw: Gateway, sql: Any) -> None:
    """The upstream draws best_of candidates, each up to max_tokens: the token budget must hold
    them all before the request goes out."""
    name = "bestof-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name, tpm=300)
    client = capabilities_gw.client(keys.create_key(sql, name).key)
    ask = {"model": "fake", "prompt": "hi #chunks=1", "max_tokens": 100}
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(**ask, best_of=4)  # 4 × 100 tokens: over 300
    assert refused.value.code == "tokens_per_minute"
    assert client.completions.create(**ask, best_of=2).choices  # 2 × 100 fit
