"""Structured outputs and tool calls end to end on smollm2, the real engine behind the gateway: a
forced function tool through the Responses API, chat.completions.parse with a Pydantic model, and
LangChain's with_structured_output in its three methods. The engine's constrained decoding makes
even a 135M model answer in the shape asked for."""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.gateway.conftest import Gateway
from tokenyard.tenancy import keys, teams

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def gw(
    engine: str, base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    env = {**base_env, "TOKENYARD_ENGINE_URLS": f"smollm2={engine}"}
    gateway = Gateway(env, tmp_path_factory.mktemp("structured") / "gateway.log")
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def key(sql: Any) -> str:
    name = "struct-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    return keys.create_key(sql, name).key


def test_responses_with_a_forced_function_tool(gw: Gateway, key: str) -> None:
    client = gw.client(key, timeout=600)
    response = client.responses.create(
        model="smollm2",
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    arguments = json.loads(calls[0].arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)


def test_chat_completions_parse(gw: Gateway, key: str) -> None:
    client = gw.client(key, timeout=600)
    completion = client.chat.completions.parse(
        model="smollm2",
        messages=[{"role": "user", "content": "Name a city and its country."}],
        response_format=City,
        max_tokens=60,
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City) and parsed.name and parsed.country


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(gw: Gateway, key: str, method: str) -> None:
    model = ChatOpenAI(
        model="smollm2",
        base_url=gw.url + "/v1",
        api_key=key,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=60,  # type: ignore[call-arg]
        max_retries=0,
        timeout=600,
    )
    structured = model.with_structured_output(City, method=method)  # type: ignore[arg-type]
    prompt = "Name a city and its country."
    if method == "json_mode":  # JSON mode follows the prompt, not a schema: say the keys
        prompt += ' Answer in JSON with the keys "name" and "country".'
    city = structured.invoke(prompt)
    assert isinstance(city, City) and city.name and city.country
