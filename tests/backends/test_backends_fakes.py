"""The fake servers speak the real wire formats: the official SDKs parse what they send, streamed
and not, tool calls and errors included."""

import json

import anthropic
import openai
import pytest

TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.fixture
def oai(openai_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_url + "/v1", api_key="sk-x", max_retries=0)


@pytest.fixture
def claude(anthropic_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=anthropic_url, api_key="sk-ant-x", max_retries=0)


def test_openai_sdk_chat_and_completions(oai):
    reply = oai.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi #chunks=2"}]
    )
    assert reply.choices[0].message.content == "w0 w1 "
    assert reply.usage is not None and reply.usage.completion_tokens == 2
    text = oai.completions.create(model="gpt-4o-mini", prompt="once #chunks=3")
    assert text.choices[0].text == "w0 w1 w2 "


def test_openai_sdk_stream_with_usage_and_tool_calls(oai):
    stream = oai.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "#tool"}],
        tools=[TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    arguments = "".join(
        call.function.arguments or ""
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or []
    )
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_openai_sdk_sees_typed_errors(oai):
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "#status=429 #retry_after=1"}]
        )
    with pytest.raises(openai.BadRequestError, match="top_k"):
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], extra_body={"top_k": 2}
        )
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "#status=500"}]
        )


def test_anthropic_sdk_message_with_tool_use(claude):
    message = claude.messages.create(
        model="claude-fake-1",
        max_tokens=20,
        system="Be brief.",
        messages=[{"role": "user", "content": "#tool #chunks=2 #cached=1"}],
        tools=[{"name": "weather", "input_schema": {"type": "object"}}],
    )
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}
    assert message.usage.cache_read_input_tokens == 1


def test_anthropic_sdk_stream_accumulates_the_message(claude):
    with claude.messages.stream(
        model="claude-fake-1",
        max_tokens=20,
        messages=[{"role": "user", "content": "#tool #chunks=3"}],
        tools=[{"name": "weather", "input_schema": {"type": "object"}}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == "w0 w1 w2 "
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 3


def test_anthropic_sdk_sees_typed_errors(claude):
    def ask(text: str) -> None:
        claude.messages.create(
            model="claude-fake-1",
            max_tokens=5,
            messages=[{"role": "user", "content": text}],
        )

    with pytest.raises(anthropic.RateLimitError):
        ask("#status=429")
    with pytest.raises(anthropic.OverloadedError) as err:
        ask("#status=529")
    assert err.value.status_code == 529
    assert err.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.BadRequestError, match="alternate"):
        claude.messages.create(
            model="c",
            max_tokens=5,
            messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        )
    with (
        pytest.raises(anthropic.APIStatusError, match="Overloaded"),
        claude.messages.stream(
            model="c", max_tokens=5, messages=[{"role": "user", "content": "#stream_error=2"}]
        ) as stream,
    ):
        list(stream)
