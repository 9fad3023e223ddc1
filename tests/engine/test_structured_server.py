"""Structured outputs, tool calls and logit_bias through the engine's server, with the official
openai SDK as users call it."""

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from openai import pydantic_function_tool
from pydantic import BaseModel, Field

from tests.engine.test_server import server, wait_idle  # noqa: F401 - the server fixture, by name

MODEL = "smollm2"


@pytest.fixture
def sdk(server):  # noqa: F811
    """The SDK on the engine's server; after each test, every sequence and block is released."""
    yield openai.OpenAI(base_url=server[0] + "/v1", api_key="unused")


@pytest.fixture
def tokenizer(server):  # noqa: F811
    return server[1].tokenizer


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    city: Literal["Paris", "Rotterdam", "Lima"]


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=20)
    unit: Literal["celsius", "fahrenheit"]


class Search(BaseModel):
    query: str = Field(max_length=30)
    limit: int = Field(ge=1, le=10)


PERSON_PROMPT = [{"role": "user", "content": "Describe a person who lives in Lima."}]
WEATHER_PROMPT = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_parse_returns_the_pydantic_object(sdk):
    completion = sdk.chat.completions.parse(
        model=MODEL, messages=PERSON_PROMPT, response_format=Person, max_tokens=80, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


def test_streamed_parse_at_temperature_one(sdk):
    with sdk.chat.completions.stream(
        model=MODEL,
        messages=PERSON_PROMPT,
        response_format=Person,
        max_tokens=80,
        temperature=1.0,
        seed=3,
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 3  # streamed as it was generated
    assert isinstance(final.choices[0].message.parsed, Person)


def test_json_object_mode_returns_an_object(sdk):
    reply = sdk.chat.completions.create(
        model=MODEL,
        messages=PERSON_PROMPT,
        response_format={"type": "json_object"},
        max_tokens=60,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_named_tool_call_is_forced_and_its_arguments_validate(sdk):
    tools = [pydantic_function_tool(GetWeather), pydantic_function_tool(Search)]
    completion = sdk.chat.completions.parse(
        model=MODEL,
        messages=WEATHER_PROMPT,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=60,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    jsonschema.validate(json.loads(call.function.arguments), tools[0]["function"]["parameters"])


def test_required_tool_call_streams_incremental_arguments(sdk):
    tools = [pydantic_function_tool(GetWeather), pydantic_function_tool(Search)]
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=WEATHER_PROMPT,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=1.0,
        seed=11,
        stream=True,
    )
    calls: dict[int, dict] = {}
    fragments, reasons = 0, []
    for chunk in stream:
        choice = chunk.choices[0]
        reasons.append(choice.finish_reason)
        assert not choice.delta.content
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            if delta.function.name:
                call["name"] += delta.function.name
            if delta.function.arguments:
                call["arguments"] += delta.function.arguments
                fragments += 1
    assert reasons[-1] == "tool_calls"
    (call,) = calls.values()  # parallel_tool_calls false: exactly one
    assert call["id"].startswith("call_") and fragments > 2
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}[call["name"]]
    jsonschema.validate(json.loads(call["arguments"]), schema)


def test_tool_history_and_auto_choice_are_served(sdk):
    """An assistant message with tool_calls and the tool's result, in the fallback format."""
    messages = [
        *WEATHER_PROMPT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "GetWeather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    reply = sdk.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[pydantic_function_tool(GetWeather)],
        tool_choice="auto",
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    without = sdk.chat.completions.create(
        model=MODEL, messages=messages[:1], max_tokens=1, temperature=0
    )
    # the tool listing, the call and its result were written into the prompt
    assert reply.usage.prompt_tokens > without.usage.prompt_tokens + 100


@pytest.mark.parametrize(
    ("body", "param", "named"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {"a": {"not": {"type": "string"}}},
                        },
                    },
                }
            },
            "response_format",
            "'not'",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"u": {"type": "string", "format": "iri"}},
                            },
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "'format': 'iri'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "only allowed when tools are given"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        ({"logit_bias": {"hello": 1}}, "logit_bias", "token ids"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "token ids"),
        ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens", "grammar"),
        ({"guided_regex": "(abc"}, "guided_regex", "parenthesis is not closed"),
        (
            {"structured_outputs": {"grammar": 'root ::= "a" |'}},
            "structured_outputs.grammar",
            "EBNF",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty"),
        ({"structured_outputs": {"choice": ["a", ""]}}, "structured_outputs.choice", "non-empty"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "JSON schema"),
        ({"structured_outputs": {"lark": "x"}}, "structured_outputs", "lark"),
        (
            {"structured_outputs": {"regex": "a+"}, "guided_choice": ["a"]},
            "guided_choice",
            "one kind",
        ),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
            "guided_regex",
            "response_format",
        ),
    ],
)
def test_bad_structured_requests_are_400_naming_the_field(sdk, body, param, named):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model=MODEL, messages=PERSON_PROMPT, max_tokens=4, extra_body=body
        )
    error = caught.value.body
    assert error["param"] == param and named in error["message"]
    assert error["type"] == "invalid_request_error"


def test_logit_bias_forces_and_bans_tokens(sdk, tokenizer):
    plain = sdk.chat.completions.create(
        model=MODEL, messages=PERSON_PROMPT, max_tokens=3, temperature=0, logprobs=True
    )
    first = plain.choices[0].logprobs.content[0].token
    first_id = tokenizer.encode(first)[0]
    banned = sdk.chat.completions.create(
        model=MODEL,
        messages=PERSON_PROMPT,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        logit_bias={str(first_id): -100},
    )
    assert banned.choices[0].logprobs.content[0].token != first
    target = tokenizer.encode(" banana")[0]
    forced = sdk.chat.completions.create(
        model=MODEL,
        messages=PERSON_PROMPT,
        max_tokens=3,
        temperature=1.0,
        logit_bias={str(target): 100},
    )
    assert forced.choices[0].message.content == tokenizer.decode([target] * 3)


ANSWER = [{"role": "user", "content": "Is the sky blue on a clear day? Answer yes or no."}]


def test_vllms_structured_outputs_choice_regex_grammar_and_json(sdk):
    """vLLM's `structured_outputs` (and its older `guided_*` names), on chat and on text
    completions, sampled at temperature 1 so that only the grammar keeps the output in shape."""
    options = ["yes", "no", "it depends"]
    for body in ({"structured_outputs": {"choice": options}}, {"guided_choice": options}):
        for seed in range(3):
            reply = sdk.chat.completions.create(
                model=MODEL, messages=ANSWER, max_tokens=8, seed=seed, extra_body=body
            )
            assert reply.choices[0].message.content in options
            assert reply.choices[0].finish_reason == "stop"
    phone = r"\(0\d{2}\) \d{3}-\d{4}"
    for seed in range(3):
        out = sdk.completions.create(
            model=MODEL,
            prompt="Call us on",
            max_tokens=20,
            seed=seed,
            extra_body={"structured_outputs": {"regex": phone}},
        )
        assert re.fullmatch(phone, out.choices[0].text), out.choices[0].text
    grammar = 'root ::= "Colours: " colour (", " colour)* "."\ncolour ::= "red" | "green" | "blue"'
    listed = sdk.completions.create(
        model=MODEL,
        prompt="Name some colours.",
        max_tokens=30,
        seed=1,
        extra_body={"guided_grammar": grammar},
    )
    text = listed.choices[0].text
    assert re.fullmatch(r"Colours: (red|green|blue)(, (red|green|blue))*\.", text), text
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for body in ({"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)}):
        got = sdk.chat.completions.create(
            model=MODEL, messages=ANSWER, max_tokens=30, seed=2, extra_body=body
        )
        jsonschema.validate(json.loads(got.choices[0].message.content), schema)


def test_the_deprecated_functions_form_is_served_in_its_own_form(sdk):
    """OpenAI's deprecated `functions` / `function_call`: a forced call comes back as
    `message.function_call` (finish_reason "function_call"), whole and streamed, and a
    conversation holding a call and its `function` result is read."""
    function = pydantic_function_tool(GetWeather)["function"]
    asked = {
        "model": MODEL,
        "messages": WEATHER_PROMPT,
        "functions": [function],
        "function_call": {"name": "GetWeather"},
        "max_tokens": 60,
        "temperature": 0,
    }
    whole = sdk.chat.completions.create(**asked)
    choice = whole.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    call = choice.message.function_call
    assert call.name == "GetWeather"
    jsonschema.validate(json.loads(call.arguments), function["parameters"])
    chunks = list(sdk.chat.completions.create(**asked, stream=True))
    pieces = [c.choices[0].delta.function_call for c in chunks if c.choices]
    pieces = [p for p in pieces if p is not None]
    assert pieces[0].name == "GetWeather"
    assert "".join(p.arguments or "" for p in pieces) == call.arguments
    assert chunks[-1].choices[0].finish_reason == "function_call"
    history = [
        *WEATHER_PROMPT,
        {"role": "assistant", "content": None, "function_call": call.model_dump()},
        {"role": "function", "name": "GetWeather", "content": '{"temperature": 21}'},
    ]
    reply = sdk.chat.completions.create(
        model=MODEL, messages=history, functions=[function], max_tokens=12, temperature=0
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "function_call")
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            **asked,
            tools=[pydantic_function_tool(GetWeather)],  # both forms at once
        )
    assert err.value.body["param"] == "functions"
