"""OpenAI chat ⇄ Anthropic Messages: translation both ways (requests, replies, stream chunk
sequences, tool calls, errors), and the Anthropic backend against the fake Anthropic server."""

import json

import pytest

from tests.backends.conftest import control, stats
from tokenyard.backends.anthropic_messages import EventWriter, chat_request, message_reply
from tokenyard.backends.anthropic_wire import (
    ANSWER_TOOL,
    ChunkWriter,
    StreamError,
    chat_reply,
    error_reply,
)
from tokenyard.backends.anthropic_wire import messages_request as translate
from tokenyard.backends.base import (
    BackendUnavailable,
    UpstreamBroken,
    UpstreamCall,
    context_exceeded,
)
from tokenyard.core.errors import GatewayError

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "user", "content": [{"type": "text", "text": "And quickly."}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": "Thanks, and Rome?"},
]


def sse_events(raw: bytes) -> list[dict]:
    return [
        json.loads(block[6:])
        for block in raw.decode().split("\n\n")
        if block.startswith("data: ") and block != "data: [DONE]"
    ]


def test_request_translation_merges_roles_and_maps_tools():
    out = translate(
        {
            "model": "claude",
            "messages": CONVERSATION,
            "max_tokens": 50,
            "stop": "END",
            "temperature": 1.5,
            "top_p": 0.9,
            "user": "u-1",
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "weather"}},
            "parallel_tool_calls": False,
            "seed": 3,
            "tier": "batch",
        },
        "claude-3-5-haiku-latest",
    )
    assert out["model"] == "claude-3-5-haiku-latest"
    assert out["system"] == "Be brief.\n\nUse tools."
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "Weather in Paris?"},
        {"type": "text", "text": "And quickly."},
    ]
    assert out["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}
    ]
    assert out["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
        {"type": "text", "text": "Thanks, and Rome?"},
    ]
    assert out["max_tokens"] == 50 and out["stop_sequences"] == ["END"]
    assert out["temperature"] == 1.0 and out["top_p"] == 0.9
    assert out["metadata"] == {"user_id": "u-1"}
    assert out["tools"] == [
        {
            "name": "weather",
            "description": "the weather in a city",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
    ]
    assert out["tool_choice"] == {
        "type": "tool",
        "name": "weather",
        "disable_parallel_tool_use": True,
    }
    assert "seed" not in out and "tier" not in out and "stream" not in out


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", {"type": "auto"}), ("required", {"type": "any"}), ("none", {"type": "none"})],
)
def test_tool_choice_strings(choice, expected):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": choice}
    assert translate(body, "c")["tool_choice"] == expected


def test_images_and_default_max_tokens():
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    out = translate({"messages": [{"role": "user", "content": content}]}, "c")
    assert out["max_tokens"] == 4096
    assert out["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("logprobs", True),
        # a JSON answer rides on a forced tool: the request's own tools cannot ride beside it
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ],
)
def test_unsupported_parameters_are_a_400_naming_them(field, value):
    json_answer = {"response_format": {"type": "json_object"}} if field == "tools" else {}
    body = {"messages": [{"role": "user", "content": "x"}], field: value, **json_answer}
    with pytest.raises(GatewayError) as err:
        translate(body, "c")
    assert err.value.status == 400 and err.value.param == field


def test_a_json_answer_is_a_forced_tool_and_its_input_the_content():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    wanted = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    out = translate(
        {"messages": [{"role": "user", "content": "x"}], "response_format": wanted}, "c"
    )
    assert out["tools"] == [
        {
            "name": ANSWER_TOOL,
            "description": "Answer the user, in exactly this JSON structure.",
            "input_schema": schema,
        }
    ]
    assert out["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}
    loose = translate(
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"},
        },
        "c",
    )
    assert loose["tools"][0]["input_schema"] == {"type": "object"}
    message = {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "Here it is:"},
            {"type": "tool_use", "id": "tu", "name": ANSWER_TOOL, "input": {"city": "Oslo"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    choice = chat_reply(message, "m", json_answer=True)["choices"][0]
    assert (
        choice["message"]["content"] == '{"city": "Oslo"}' and "tool_calls" not in choice["message"]
    )
    assert choice["finish_reason"] == "stop"
    # a model that answered in text despite the forced tool: its text is what there is
    plain = {**message, "content": [{"type": "text", "text": "{}"}], "stop_reason": "end_turn"}
    assert chat_reply(plain, "m", json_answer=True)["choices"][0]["message"]["content"] == "{}"
    # streamed: the tool's input deltas are the content; the preamble is not the answer
    writer = ChunkWriter("m", include_usage=False, json_answer=True)
    events = [
        ("message_start", {"message": {"id": "m1", "usage": {}}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Sure:"}}),
        (
            "content_block_start",
            {"index": 1, "content_block": {"type": "tool_use", "id": "t", "name": ANSWER_TOOL}},
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"city"'}},
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ': "Oslo"}'}},
        ),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}}),
        ("message_stop", {}),
    ]
    out = b"".join(writer.write(kind, data) for kind, data in events)
    chunks = [
        json.loads(line[6:]) for line in out.decode().split("\n") if line.startswith("data: {")
    ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == '{"city": "Oslo"}'
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_reply_translation_text_tools_and_usage():
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-haiku-20241022",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Rome"}},
        ],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 10,
            "output_tokens": 7,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
        },
    }
    reply = chat_reply(message, "claude-3-5-haiku")
    assert reply["object"] == "chat.completion" and reply["model"] == "claude-3-5-haiku"
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    assert choice["message"]["tool_calls"] == [
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
        }
    ]
    assert reply["usage"] == {
        "prompt_tokens": 115,
        "completion_tokens": 7,
        "total_tokens": 122,
        "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5},
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length")],
)
def test_finish_reasons(stop, finish):
    message = {"content": [{"type": "text", "text": "x"}], "stop_reason": stop, "usage": {}}
    assert chat_reply(message, "m")["choices"][0]["finish_reason"] == finish


def test_the_stop_sequence_that_fired_is_kept_both_ways():
    """Anthropic's stop_sequence becomes the chat choice's stop_reason (vLLM's field, as the engine
    gives it), and back: an Anthropic client learns which of its stop sequences fired, whole and
    streamed, whatever model answered."""
    message = {
        "content": [{"type": "text", "text": "x"}],
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
        "usage": {},
    }
    choice = chat_reply(message, "m")["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "END")
    reply = message_reply({"choices": [{**choice, "message": {"content": "x"}}]}, "m")
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("stop_sequence", "END")
    writer = ChunkWriter("m", include_usage=False)
    final = {"delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"}, "usage": {}}
    writer.write("message_delta", final)
    (last,) = sse_events(writer.write("message_stop", {}))
    assert last["choices"][0]["stop_reason"] == "END"
    events = EventWriter("m")
    events.chunk({"id": "1", "choices": [{**last["choices"][0], "delta": {"content": "x"}}]})
    closing = events.finish().decode()
    assert '"stop_reason":"stop_sequence","stop_sequence":"END"' in closing
    # a stop token id (the engine's stop_token_ids) or EOS is an end of turn
    for other in (7, None):
        plain = message_reply({"choices": [{"finish_reason": "stop", "stop_reason": other}]}, "m")
        assert (plain["stop_reason"], plain["stop_sequence"]) == ("end_turn", None)


@pytest.mark.parametrize(
    ("status", "kind", "want_status", "want_type"),
    [
        (400, "invalid_request_error", 400, "invalid_request_error"),
        (401, "authentication_error", 401, "authentication_error"),
        (429, "rate_limit_error", 429, "rate_limit_error"),
        (500, "api_error", 500, "server_error"),
        (529, "overloaded_error", 503, "server_error"),
    ],
)
def test_error_translation(status, kind, want_status, want_type):
    raw = json.dumps({"type": "error", "error": {"type": kind, "message": "nope"}}).encode()
    got_status, body = error_reply(status, raw)
    assert got_status == want_status
    assert json.loads(body) == {
        "error": {"message": "nope", "type": want_type, "param": None, "code": kind}
    }


def _openai_error(message: str, code: str | None = None, kind: str = "invalid_request_error"):
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def test_refusals_saying_the_prompt_is_too_long_are_told_apart():
    """What sends a request on to a model's context fallbacks: each server's way of saying the
    prompt does not fit, Anthropic's as its backend translates it; not other refusals."""
    too_long = {"type": "invalid_request_error", "message": "prompt is too long: 201 > 200 maximum"}
    anthropic = error_reply(400, json.dumps({"type": "error", "error": too_long}).encode())
    assert context_exceeded(*anthropic)
    for body in (
        _openai_error(
            "This model's maximum context length is 8192 tokens.", "context_length_exceeded"
        ),
        _openai_error("This model's maximum context length is 2048 tokens. However, you requested"),
        _openai_error(
            "the request exceeds the available context size", None, "exceed_context_size_error"
        ),
    ):
        assert context_exceeded(400, body)
        assert not context_exceeded(500, body)
    refused = error_reply(
        400, json.dumps({"type": "error", "error": {**too_long, "message": "no"}}).encode()
    )
    assert not context_exceeded(*refused)
    for body in (_openai_error("max_tokens must be at least 1"), b"<html>", b"[]", b'{"error": 3}'):
        assert not context_exceeded(400, body)


def test_stream_chunk_sequence_with_a_tool_call():
    writer = ChunkWriter("claude-x", include_usage=True)
    start = {"message": {"id": "msg_9", "usage": {"input_tokens": 4, "output_tokens": 1}}}
    events = [
        ("message_start", start),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ("content_block_stop", {"index": 0}),
        (
            "content_block_start",
            {
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_2", "name": "f", "input": {}},
            },
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a":'}},
        ),
        (
            "content_block_delta",
            {"index": 1, "delta": {"type": "input_json_delta", "partial_json": " 1}"}},
        ),
        ("content_block_stop", {"index": 1}),
        ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        ("message_stop", {}),
    ]
    raw = b"".join(writer.write(kind, data) for kind, data in events)
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks = sse_events(raw)
    assert {(c["object"], c["id"]) for c in chunks} == {("chat.completion.chunk", "chatcmpl-msg_9")}
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]},
        {},
        None,
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] == 4
    assert chunks[-1]["usage"]["completion_tokens"] == 9


def test_stream_without_usage_and_error_events():
    writer = ChunkWriter("m", include_usage=False)
    writer.write("message_start", {"message": {"id": "x", "usage": {}}})
    tail = sse_events(writer.write("message_stop", {}))
    assert [c["choices"][0]["finish_reason"] for c in tail] == ["stop"]
    with pytest.raises(StreamError) as err:
        writer.write("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert err.value.status == 503 and err.value.kind == "overloaded_error"


def chat(content: str, **extra: object) -> UpstreamCall:
    body = {"model": "claude", "messages": [{"role": "user", "content": content}], **extra}
    return UpstreamCall(CHAT, json.dumps(body).encode(), {})


async def test_complete_against_the_fake(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url], model_id="haiku")
    reply = await upstream.complete(chat("hello there #chunks=3 #cached=1", max_tokens=20))
    assert reply.status == 200
    body = json.loads(reply.body)
    assert body["model"] == "haiku"
    assert body["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert body["usage"]["prompt_tokens"] == 4  # every word: cached ones included
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 1
    seen = stats(anthropic_url)
    assert seen["last_path"] == "/v1/messages"
    assert seen["last_headers"]["x-api-key"] == "sk-test-secret"
    assert seen["last_headers"]["anthropic-version"] == "2023-06-01"
    assert seen["last_body"]["model"] == "claude-3-5-haiku-latest"


async def test_a_tool_conversation_round_trips_against_the_fake(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url])
    body = {"model": "c", "messages": [*CONVERSATION, {"role": "user", "content": "#tool"}]}
    reply = await upstream.complete(
        UpstreamCall(CHAT, json.dumps({**body, "tools": TOOLS}).encode(), {})
    )
    assert reply.status == 200, reply.body  # the fake refuses unmerged roles
    choice = json.loads(reply.body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris"
    }


async def test_stream_against_the_fake(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url], model_id="haiku")
    stream = await upstream.open_stream(
        chat("#tool #chunks=2", stream=True, stream_options={"include_usage": True}, tools=TOOLS)
    )
    raw = b"".join([c async for c in stream.chunks()])
    await stream.aclose()
    chunks = sse_events(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "w0 w1 "
    arguments = "".join(
        call["function"].get("arguments", "")
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 2
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_a_json_answer_against_the_fake_whole_and_streamed(make_upstream, anthropic_url):
    """The forced answer tool goes out (the fake, as Anthropic's models, must call it), and its
    input comes back as the message's content, whole or in deltas."""
    upstream = make_upstream("anthropic", [anthropic_url])
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    wanted = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    reply = await upstream.complete(chat("where? #chunks=2", response_format=wanted))
    choice = json.loads(reply.body)["choices"][0]
    assert json.loads(choice["message"]["content"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    sent = stats(anthropic_url)["last_body"]
    assert sent["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}
    assert sent["tools"][0]["input_schema"] == schema
    stream = await upstream.open_stream(
        chat("where? #chunks=2", stream=True, response_format=wanted)
    )
    chunks = sse_events(b"".join([c async for c in stream.chunks()]))
    await stream.aclose()
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert json.loads(text) == {"city": "Paris"}  # the preamble ("w0 w1 ") is not the answer
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_completions_endpoint_is_a_clear_400(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url])
    body = json.dumps({"model": "c", "prompt": "x"}).encode()
    with pytest.raises(GatewayError) as err:
        await upstream.complete(UpstreamCall("/v1/completions", body, {}))
    assert err.value.status == 400 and err.value.code == "unsupported_endpoint"


async def test_refusals_are_translated_and_overload_is_retried(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url])
    control(anthropic_url, reset=True)
    reply = await upstream.complete(chat("bad #status=400"))
    assert reply.status == 400
    assert json.loads(reply.body)["error"]["type"] == "invalid_request_error"
    stream = await upstream.open_stream(chat("no #status=401", stream=True))
    assert stream.status == 401
    assert json.loads(await stream.read_all())["error"]["code"] == "authentication_error"
    reply = await upstream.complete(chat("busy #status=529 #times=2"))
    assert reply.status == 200
    assert stats(anthropic_url)["requests"] == 5
    with pytest.raises(BackendUnavailable):
        await upstream.complete(chat("down #status=529"))


async def test_an_error_event_first_is_retried_later_it_breaks_the_stream(
    make_upstream, anthropic_url
):
    upstream = make_upstream("anthropic", [anthropic_url])
    control(anthropic_url, reset=True)
    with pytest.raises(BackendUnavailable):
        await upstream.open_stream(chat("overloaded #stream_error=0", stream=True))
    assert stats(anthropic_url)["requests"] == 3
    stream = await upstream.open_stream(chat("later #stream_error=4 #chunks=3", stream=True))
    got = []
    with pytest.raises(UpstreamBroken):
        async for chunk in stream.chunks():
            got.append(chunk)
    await stream.aclose()
    assert [c["choices"][0]["delta"] for c in sse_events(b"".join(got))] == [
        {"role": "assistant", "content": ""},
        {"content": "w0 "},
    ]
    assert stats(anthropic_url)["requests"] == 4


async def test_a_cut_stream_is_broken_and_not_retried(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url])
    control(anthropic_url, reset=True)
    stream = await upstream.open_stream(chat("cut #cut=5 #chunks=4", stream=True))
    got = []
    with pytest.raises(UpstreamBroken):
        async for chunk in stream.chunks():
            got.append(chunk)
    text = [c["choices"][0]["delta"].get("content") for c in sse_events(b"".join(got))]
    assert text == ["", "w0 ", "w1 "]
    assert stats(anthropic_url)["requests"] == 1


THINK = {"max_tokens": 3000, "reasoning_effort": "low"}


def test_reasoning_effort_is_extended_thinking_within_anthropics_rules():
    """A budget per effort, no temperature or top_k beside it (Anthropic refuses them with
    thinking), none at all for "none"; a JSON answer, a forced tool or a cap at or under the
    budget are 400s naming the field."""
    asked = {"messages": [{"role": "user", "content": "x"}], "temperature": 0.2, "top_k": 5}
    out = translate({**asked, **THINK, "reasoning_effort": "medium"}, "c")
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "temperature" not in out and "top_k" not in out
    plain = translate({**asked, **THINK, "reasoning_effort": "none"}, "c")
    assert "thinking" not in plain and plain["temperature"] == 0.2
    refusals = {
        "response_format": {"response_format": {"type": "json_object"}},
        "tool_choice": {"tools": TOOLS, "tool_choice": "required"},
        "max_tokens": {"max_tokens": 1024},
        "reasoning_effort": {"reasoning_effort": "maximal"},
    }
    for param, fields in refusals.items():
        with pytest.raises(GatewayError) as err:
            translate({**asked, **THINK, **fields}, "c")
        assert (err.value.status, err.value.param) == (400, param)


async def test_thinking_round_trips_with_its_signature_against_the_fake(
    make_upstream, anthropic_url
):
    """The reply's thinking comes back as reasoning_content and thinking_blocks; sent back on the
    assistant turn with the tool's result, the fake (as Anthropic) checks its signature; a
    client that drops the blocks gets an answer without thinking rather than Anthropic's 400."""
    upstream = make_upstream("anthropic", [anthropic_url])
    question = {"role": "user", "content": "Weather in Paris? #tool"}
    body = {"model": "c", "messages": [question], "tools": TOOLS, **THINK, "temperature": 0.3}
    reply = await upstream.complete(UpstreamCall(CHAT, json.dumps(body).encode(), {}))
    assert reply.status == 200, reply.body
    got = json.loads(reply.body)
    message = got["choices"][0]["message"]
    sent = stats(anthropic_url)["last_body"]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert "temperature" not in sent
    assert message["reasoning_content"] == "The user asks; I weigh it."
    (block,) = message["thinking_blocks"]
    assert block["type"] == "thinking" and block["signature"]
    assert got["usage"]["completion_tokens"] == 5 + 6  # the text's and the thinking's

    def follow_up(assistant: dict) -> UpstreamCall:
        result = {"role": "tool", "tool_call_id": "toolu_fake", "content": "sunny"}
        turns = [question, assistant, result]
        return UpstreamCall(CHAT, json.dumps({**body, "messages": turns}).encode(), {})

    answer = await upstream.complete(follow_up(message))
    assert answer.status == 200, answer.body
    assert stats(anthropic_url)["last_body"]["messages"][1]["content"][0] == block
    forged = {**message, "thinking_blocks": [{**block, "thinking": "Something else."}]}
    refused = await upstream.complete(follow_up(forged))
    assert refused.status == 400 and b"signature" in refused.body
    dropped = {k: v for k, v in message.items() if k != "thinking_blocks"}
    unthinking = await upstream.complete(follow_up(dropped))
    assert unthinking.status == 200, unthinking.body
    assert "thinking" not in stats(anthropic_url)["last_body"]


async def test_thinking_streams_as_reasoning_deltas_then_its_block(make_upstream, anthropic_url):
    upstream = make_upstream("anthropic", [anthropic_url])
    stream = await upstream.open_stream(chat("think #chunks=2", stream=True, **THINK))
    chunks = sse_events(b"".join([c async for c in stream.chunks()]))
    await stream.aclose()
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user asks; I weigh it."
    (blocks,) = [d["thinking_blocks"] for d in deltas if "thinking_blocks" in d]
    assert blocks[0]["thinking"] == "The user asks; I weigh it." and blocks[0]["signature"]
    assert "".join(d.get("content") or "" for d in deltas) == "w0 w1 "


def test_anthropics_thinking_field_sets_the_budget_to_the_token():
    """`thinking` as the Messages API takes it (what /v1/messages sends on): its budget goes as
    asked, a disabled one asks for nothing; without an output cap the default one leaves room past
    the budget; beside reasoning_effort, or malformed, it is a 400 naming it."""
    asked = {"messages": [{"role": "user", "content": "x"}], "temperature": 0.2}
    thinking = {"type": "enabled", "budget_tokens": 5000}
    out = translate({**asked, "max_tokens": 6000, "thinking": thinking}, "c")
    assert out["thinking"] == thinking and "temperature" not in out
    uncapped = translate({**asked, "thinking": thinking}, "c")
    assert uncapped["max_tokens"] > 5000
    off = translate({**asked, "max_tokens": 9, "thinking": {"type": "disabled"}}, "c")
    assert "thinking" not in off and off["temperature"] == 0.2
    for wrong in (
        {"reasoning_effort": "low"},
        {"thinking": {"type": "enabled", "budget_tokens": 1023}},
        {"thinking": {"type": "enabled", "budget_tokens": True}},
        {"thinking": {"type": "sometimes"}},
        {"thinking": "on"},
    ):
        with pytest.raises(GatewayError) as err:
            translate({"thinking": thinking, **asked, "max_tokens": 6000, **wrong}, "c")
        assert (err.value.status, err.value.param) == (400, "thinking"), wrong
    with pytest.raises(GatewayError) as err:
        translate({**asked, "max_tokens": 5000, "thinking": thinking}, "c")
    assert err.value.param == "max_tokens"


def _blocks(raw: bytes) -> list[tuple[str, int | None, dict | None]]:
    """Anthropic stream events: (type, block index, its delta or opening block)."""
    found = [
        json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")
    ]
    return [(e["type"], e.get("index"), e.get("delta") or e.get("content_block")) for e in found]


def test_the_messages_front_keeps_signed_thinking_and_shows_another_models_reasoning():
    """/v1/messages' translation: a history's signed (and redacted) thinking blocks ride on the
    assistant message, unsigned ones (another provider's reasoning shown earlier) are dropped; a
    reply's reasoning_content without Anthropic's blocks is one unsigned thinking block first,
    whole and streamed."""
    signed = {"type": "thinking", "thinking": "hm", "signature": "sig"}
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    unsigned = {"type": "thinking", "thinking": "elsewhere", "signature": ""}
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [signed, redacted, {"type": "text", "text": "a"}]},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": [unsigned, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "again"},
    ]
    thinking = {"type": "enabled", "budget_tokens": 2000}
    chat = chat_request({"model": "m", "max_tokens": 9, "messages": turns, "thinking": thinking})
    assert chat["thinking"] == thinking
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "a",
        "thinking_blocks": [signed, redacted],
    }
    assert chat["messages"][3] == {"role": "assistant", "content": "b"}
    with pytest.raises(GatewayError):  # thinking is the assistant's alone
        chat_request(
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [signed]}]}
        )

    reasoned = {"content": "answer", "reasoning_content": "I think"}
    reply = message_reply({"choices": [{"finish_reason": "stop", "message": reasoned}]}, "m")
    assert reply["content"] == [
        {"type": "thinking", "thinking": "I think", "signature": ""},
        {"type": "text", "text": "answer"},
    ]
    writer = EventWriter("m")
    raw = b"".join(
        writer.chunk({"id": "1", "choices": [{"delta": delta}]})
        for delta in ({"reasoning_content": "I "}, {"reasoning_content": "think"}, {"content": "a"})
    )
    events = _blocks(raw + writer.finish())
    assert events[1:7] == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "I "}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "think"}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "a"}),
    ]
    # Anthropic's own: the whole block closes what was streamed with its signature; a redacted
    # block is one of its own
    writer = EventWriter("m")
    raw = writer.chunk({"id": "1", "choices": [{"delta": {"reasoning_content": "hm"}}]})
    raw += writer.chunk(
        {"id": "1", "choices": [{"delta": {"thinking_blocks": [signed, redacted]}}]}
    )
    events = _blocks(raw)
    assert events[1:] == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "hm"}),
        ("content_block_delta", 0, {"type": "signature_delta", "signature": "sig"}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, redacted),
        ("content_block_stop", 1, None),
    ]


def test_adaptive_thinking_and_its_effort():
    """{type: adaptive} and Anthropic's output_config go as asked; a model the catalog says thinks
    adaptively (Opus 4.7 and Claude 5 refuse a budget) takes reasoning_effort as adaptive thinking
    at that effort, a budgeted one as a budget; output_config beside reasoning_effort is a 400."""
    asked = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100}
    adaptive = {"type": "adaptive"}
    out = translate({**asked, "thinking": adaptive, "output_config": {"effort": "max"}}, "c")
    assert (out["thinking"], out["output_config"]) == (adaptive, {"effort": "max"})
    assert translate({**asked, "thinking": adaptive}, "c")["max_tokens"] == 100  # no budget
    effort = translate({**asked, "reasoning_effort": "minimal"}, "c", adaptive=True)
    assert (effort["thinking"], effort["output_config"]) == (adaptive, {"effort": "low"})
    budgeted = translate({**asked, "max_tokens": 5000, "reasoning_effort": "high"}, "c")
    assert budgeted["thinking"]["type"] == "enabled" and "output_config" not in budgeted
    assert "thinking" not in translate({**asked, "reasoning_effort": "none"}, "c", adaptive=True)
    for wrong, param in (
        ({"reasoning_effort": "high", "output_config": {"effort": "high"}}, "output_config"),
        ({"output_config": "high"}, "output_config"),
    ):
        with pytest.raises(GatewayError) as err:
            translate({**asked, **wrong}, "c", adaptive=True)
        assert err.value.param == param
