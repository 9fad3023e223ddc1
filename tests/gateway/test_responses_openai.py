"""The Responses API on an OpenAI model: passed through to OpenAI's own /v1/responses (the fake
OpenAI server, tests/backends/fake_openai.py), with the gateway keeping the conversation: the
whole context goes as input with store false, the answer comes back under the gateway's id,
stored, billed from its usage; the same walk as chat (keys, quotas, settling)."""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.backends.conftest import HERE as BACKENDS
from tests.backends.conftest import control, start_server, stats
from tests.gateway.conftest import Gateway, day_tokens, reservations, wait_until
from tests.openai_spec import problems
from tokenyard.guard import store as guard_store
from tokenyard.guard.policy import DEFAULT, apply, parse_change
from tokenyard.tenancy import keys, teams

KEY_ENV = "TEST_RESPONSES_OPENAI_KEY"
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.fixture(scope="module")
def openai_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_server(
        BACKENDS / "fake_openai.py", tmp_path_factory.mktemp("oa") / "openai.log"
    )
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def gw(
    base_env: dict[str, str], openai_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("responses-openai")
    catalog = tmp / "catalog.toml"
    catalog.write_text(
        f"""
[[models]]
id = "gpt-fake"
provider = "openai"
upstream_model = "gpt-4o-mini"
base_urls = ["{openai_url}/v1"]
api_key_env = "{KEY_ENV}"
price = {{ input = 0.15, output = 0.6 }}
supports = {{ tools = true, structured_outputs = true, logprobs = true }}

[[models]]
id = "o-fake"
provider = "openai"
upstream_model = "o4-mini"
base_urls = ["{openai_url}/v1"]
api_key_env = "{KEY_ENV}"
max_tokens_param = "max_completion_tokens"
supports = {{ tools = true, reasoning = true }}
"""
    )
    env = {**base_env, "TOKENYARD_CATALOG": str(catalog), KEY_ENV: "sk-test"}
    gateway = Gateway(env, tmp / "gateway.log")
    yield gateway
    gateway.stop()


@pytest.fixture
def team(sql: Any) -> tuple[str, str]:
    name = "roa-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    return name, keys.create_key(sql, name).key


def test_passed_through_with_the_conversation_kept_by_the_gateway(
    gw: Gateway, team: tuple[str, str], openai_url: str, redis_server: Any
) -> None:
    control(openai_url, reset=True)
    name, key = team
    client = gw.client(key)
    first = client.responses.create(
        model="gpt-fake",
        instructions="Be brief.",
        input="Weather in Paris? #tool",
        tools=[TOOL],  # type: ignore[list-item]
        max_output_tokens=50,
    )
    seen = stats(openai_url)
    assert seen["last_path"] == "/v1/responses"
    sent = seen["last_body"]
    assert sent["model"] == "gpt-4o-mini" and sent["store"] is False
    assert sent["instructions"] == "Be brief." and sent["max_output_tokens"] == 50
    assert "truncation" not in sent
    assert sent["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris? #tool"}],
        }
    ]
    assert first.id.startswith("resp_") and first.id != "resp_fake"  # the gateway's id
    assert first.model == "gpt-fake" and first.store is True
    (call,) = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    raw = client.responses.with_raw_response.retrieve(first.id)
    assert not problems("Response", json.loads(raw.text))

    second = client.responses.create(
        model="gpt-fake",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        truncation="auto",
    )
    sent = stats(openai_url)["last_body"]
    assert "previous_response_id" not in sent  # OpenAI stores nothing: the gateway sends it all
    assert sent["truncation"] == "auto"  # OpenAI truncates by its own count
    assert [i["type"] for i in sent["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert "instructions" not in sent  # not carried over, as at OpenAI
    assert second.previous_response_id == first.id and second.output_text == "w0 w1 w2 w3 w4 "
    # billed from the Responses usage, through the same settling as chat
    assert first.usage and second.usage
    spent = first.usage.total_tokens + second.usage.total_tokens
    wait_until(lambda: day_tokens(redis_server.client(), name) == spent, 5, "usage settled")
    assert reservations(redis_server.client(), name)["leases"] == 0


def test_streamed_events_pass_through_under_the_gateways_id(
    gw: Gateway, team: tuple[str, str], redis_server: Any
) -> None:
    name, key = team
    client = gw.client(key)
    with client.responses.stream(model="gpt-fake", input="Hello #chunks=3") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert all(e.response.id == final.id for e in events if hasattr(e, "response"))
    assert final.output_text == "w0 w1 w2 "
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.model == "gpt-fake"
    assert final.usage is not None
    total = final.usage.total_tokens
    wait_until(lambda: day_tokens(redis_server.client(), name) == total, 5, "usage settled")


def test_reasoning_where_the_model_supports_it_and_refused_where_not(
    gw: Gateway, team: tuple[str, str], openai_url: str
) -> None:
    client = gw.client(team[1])
    reasoned = client.responses.create(
        model="o-fake", input="Think #chunks=2", reasoning={"effort": "low"}
    )
    assert stats(openai_url)["last_body"]["reasoning"] == {"effort": "low"}
    assert reasoned.output_text == "w0 w1 "
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-fake", input="x", reasoning={"effort": "low"})
    assert refused.value.body["param"] == "reasoning.effort"  # type: ignore[index]
    assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]


def test_personal_data_is_masked_in_what_openai_gets(
    gw: Gateway, team: tuple[str, str], openai_url: str, sql: Any
) -> None:
    """A Responses request goes to OpenAI in OpenAI's own form: the team's masking reaches that
    form too, user text and tool output alike."""
    control(openai_url, reset=True)
    name, key = team
    policy = apply(DEFAULT, [parse_change("pii.email=mask")])
    guard_store.write_policy(sql, name, policy)
    client = gw.client(key)

    def sent() -> list[dict[str, Any]]:
        client.responses.create(
            model="gpt-fake",
            input=[
                {"role": "user", "content": "Mail jo@example.org"},
                {"type": "function_call_output", "call_id": "c1", "output": "ops@example.com"},
            ],
        )
        return stats(openai_url)["last_body"]["input"]

    wait_until(lambda: "[EMAIL_1]" in json.dumps(sent()), 5, "the policy in force")
    user, output = sent()
    assert user["content"][0]["text"] == "Mail [EMAIL_1]" and output["output"] == "[EMAIL_2]"


def test_masked_personal_data_comes_back_in_openais_own_replies(
    gw: Gateway, team: tuple[str, str], openai_url: str, sql: Any
) -> None:
    """What OpenAI's Responses API says back in its own form, whole or as events, gets the masked
    values back before the client reads it, as a chat reply does: OpenAI saw only the
    placeholder."""
    control(openai_url, reset=True)
    name, key = team
    guard_store.write_policy(sql, name, apply(DEFAULT, [parse_change("pii.email=mask")]))
    client = gw.client(key)
    asked = "Mail jo@example.org #echo"

    def whole() -> str:
        return client.responses.create(model="gpt-fake", input=asked).output_text

    def upstream_saw() -> str:
        return json.dumps(stats(openai_url)["last_body"]["input"])

    wait_until(lambda: "[EMAIL_1]" in whole() + upstream_saw(), 5, "the policy in force")
    assert whole() == "Mail jo@example.org #echo "
    events = list(client.responses.create(model="gpt-fake", input=asked, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.completed"]
    assert deltas == done.response.output_text == "Mail jo@example.org #echo "
    assert "[EMAIL_1]" not in json.dumps([e.model_dump() for e in events])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "[EMAIL_1]" in upstream_saw() and "jo@example.org" not in upstream_saw()


def test_a_background_response_of_openais_model_is_openais_own(
    gw: Gateway, team: tuple[str, str], openai_url: str
) -> None:
    """In background mode too an OpenAI model gets the request in OpenAI's own form (not in
    background there: the gateway's task waits for it), and its Response is kept as OpenAI made
    it, under the gateway's id, saying background."""
    control(openai_url, reset=True)
    client = gw.client(team[1])
    made = client.responses.create(model="gpt-fake", input="Hi #chunks=2", background=True)
    assert made.status == "queued" and made.background is True
    wait_until(lambda: client.responses.retrieve(made.id).status == "completed", 5, "the response")
    done = client.responses.retrieve(made.id)
    assert done.output_text == "w0 w1 " and done.background is True and done.id == made.id
    sent = stats(openai_url)["last_body"]
    assert "background" not in sent and sent["store"] is False


def test_a_streamed_background_response_of_openais_model_is_numbered_on(
    gw: Gateway, team: tuple[str, str], openai_url: str
) -> None:
    """OpenAI's own events of a streamed background response follow the gateway's queued ones:
    one `response.created` (the gateway's, queued), numbered on without a gap, under the
    gateway's id; and streamed again the same."""
    control(openai_url, reset=True)
    client = gw.client(team[1])
    events = list(
        client.responses.create(
            model="gpt-fake", input="Hi #chunks=3", background=True, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    assert kinds.count("response.created") == 1 and kinds.count("response.in_progress") == 1
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    made = events[0].response.id
    assert events[-1].response.id == made and events[-1].response.output_text == "w0 w1 w2 "
    assert "background" not in stats(openai_url)["last_body"]
    assert client.responses.retrieve(made).status == "completed"
    again = list(client.responses.retrieve(made, stream=True, starting_after=2))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[3:]]


def test_a_reusable_prompt_goes_to_openai_as_input_items(
    gw: Gateway, team: tuple[str, str], openai_url: str
) -> None:
    """The gateway's prompts are its own: OpenAI gets the filled messages before the input, never
    the prompt's id."""
    _, key = team
    template = [{"role": "developer", "content": "Speak of {{city}}."}]
    made = httpx.post(
        gw.url + "/v1/prompts",
        json={"messages": template},
        headers={"authorization": f"Bearer {key}"},
    )
    pid = made.json()["id"]
    answer = gw.client(key).responses.create(
        model="gpt-fake", prompt={"id": pid, "variables": {"city": "Oslo"}}, input="hi"
    )
    sent = stats(openai_url)["last_body"]
    assert "prompt" not in sent
    assert [(i["role"], i["content"][0]["text"]) for i in sent["input"]] == [
        ("developer", "Speak of Oslo."),
        ("user", "hi"),
    ]
    assert answer.prompt is not None and answer.prompt.id == pid and answer.prompt.version == "1"
