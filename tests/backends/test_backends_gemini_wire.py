"""OpenAI chat ⇄ Gemini generateContent translation (backends/gemini_wire.py), without a server:
requests field by field, replies, stream events, refusals, and tool calls whose thought signature
rides in the id an OpenAI client sends back."""

import json
from typing import Any

import pytest

from tokenyard.backends import gemini_wire
from tokenyard.backends.base import StreamRefusal, UpstreamBroken
from tokenyard.backends.gemini_wire import (
    ChunkWriter,
    blocked,
    chat_reply,
    count_request,
    error_reply,
    generate_request,
    path,
)
from tokenyard.core.errors import GatewayError

TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_paths_of_ai_studio_and_vertex() -> None:
    assert (
        path("", "gemini-2.5-flash", "generateContent")
        == "/models/gemini-2.5-flash:generateContent"
    )
    assert path("vertex", "gemini-2.5-pro", "streamGenerateContent") == (
        "/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    )
    assert path("", "a/b", "countTokens") == "/models/a%2Fb:countTokens"  # a name cannot climb


def test_a_chat_request_becomes_generate_content() -> None:
    body = {
        "model": "gemini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use metric."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/cat.webp?s=1"}},
                ],
            },
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "max_completion_tokens": 50,
        "stop": "END",
        "n": 2,
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.1,
        "logprobs": True,
        "top_logprobs": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {}}},
        "reasoning_effort": "low",
        "user": "end-user-1",
    }
    out = generate_request(body)
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief.\n\nUse metric."}]}
    assert out["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "What is this?"},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"fileData": {"mimeType": "image/webp", "fileUri": "https://x.test/cat.webp?s=1"}},
            ],
        }
    ]
    assert out["generationConfig"] == {
        "temperature": 0.2,
        "topP": 0.9,
        "topK": 40,
        "seed": 7,
        "presencePenalty": 0.5,
        "frequencyPenalty": 0.1,
        "maxOutputTokens": 50,
        "stopSequences": ["END"],
        "candidateCount": 2,
        "responseLogprobs": True,
        "logprobs": 3,
        "responseMimeType": "application/json",
        "responseJsonSchema": {},
        "thinkingConfig": {"thinkingBudget": 1024},
    }
    # Gemini has no end-user field: the gateway's own limits read it
    assert set(out) == {"contents", "systemInstruction", "generationConfig"}
    # Anthropic's `thinking` (what /v1/messages sends on): its budget, 0 where disabled, dynamic
    # where adaptive
    for thinking, budget in (
        ({"type": "enabled", "budget_tokens": 3000}, 3000),
        ({"type": "disabled"}, 0),
        ({"type": "adaptive"}, -1),  # Gemini's dynamic thinking
    ):
        asked = {"messages": [{"role": "user", "content": "hi"}], "thinking": thinking}
        config = generate_request(asked)["generationConfig"]
        assert config["thinkingConfig"] == {"thinkingBudget": budget}
    plain = generate_request({"messages": [{"role": "user", "content": "hi"}], "n": 1})
    assert plain == {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    as_json = generate_request(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
        }
    )
    assert as_json["generationConfig"] == {"responseMimeType": "application/json"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"parallel_tool_calls": False, "tools": [TOOL]}, "parallel_tool_calls"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking": {"type": "enabled", "budget_tokens": 9}}, "thinking"),
        ({"thinking": {"type": "disabled"}, "reasoning_effort": "low"}, "thinking"),
        ({"tool_choice": "sometimes", "tools": [TOOL]}, "tool_choice"),
    ],
)
def test_what_gemini_cannot_do_is_a_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        generate_request({"messages": [{"role": "user", "content": "hi"}], **extra})
    assert err.value.status == 400 and err.value.param == param


def test_bad_conversations_are_refused() -> None:
    for messages in (
        [{"role": "system", "content": "only a system prompt"}],
        [{"role": "critic", "content": "?"}],
        [{"role": "tool", "tool_call_id": "nobody", "content": "{}"}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}],
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{not json"}}],
            },
        ],
    ):
        with pytest.raises(GatewayError) as err:
            generate_request({"messages": messages})
        assert err.value.status == 400, messages


def test_tools_and_choices() -> None:
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    out = generate_request(base)
    declared = out["tools"][0]["functionDeclarations"][0]
    assert declared == {
        "name": "weather",
        "description": "the weather in a city",
        "parametersJsonSchema": TOOL["function"]["parameters"],  # JSON Schema as it is
    }
    assert "toolConfig" not in out
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
    for choice, mode in modes.items():
        config = generate_request({**base, "tool_choice": choice})["toolConfig"]
        assert config == {"functionCallingConfig": {"mode": mode}}
    named = {"type": "function", "function": {"name": "weather"}}
    config = generate_request({**base, "tool_choice": named})["toolConfig"]
    assert config == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}}


def test_a_tool_call_round_trip_keeps_its_signature_and_answers_by_name() -> None:
    reply = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "planning", "thought": True},
                        {"text": "Let me look."},
                        {
                            "functionCall": {"name": "weather", "args": {"city": "Paris"}},
                            "thoughtSignature": "c2lnbmF0dXJl+/=",
                        },
                        {"functionCall": {"name": "time", "args": {}, "id": "g-7"}},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 4},
        "responseId": "r1",
    }
    chat = chat_reply(reply, "gem")
    message = chat["choices"][0]["message"]
    assert message["content"] == "Let me look."  # the thought is not the answer
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    first, second = message["tool_calls"]
    assert first["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    assert first["id"].startswith(gemini_wire.MADE) and first["id"].endswith("~sig~c2lnbmF0dXJl+/=")
    assert second["id"] == "g-7"  # Gemini's own id, no signature to carry
    # the client sends the conversation back as OpenAI's clients do: ids untouched
    follow = generate_request(
        {
            "messages": [
                {"role": "user", "content": "weather and time?"},
                message,
                {"role": "tool", "tool_call_id": first["id"], "content": '{"temp": 21}'},
                {"role": "tool", "tool_call_id": second["id"], "content": "noon"},
                {"role": "user", "content": "thanks"},
            ]
        }
    )
    user, model, answers = follow["contents"]
    assert user["role"] == "user" and model["role"] == "model"
    assert model["parts"] == [
        {"text": "Let me look."},
        {
            "functionCall": {"name": "weather", "args": {"city": "Paris"}},
            "thoughtSignature": "c2lnbmF0dXJl+/=",
        },
        {
            "functionCall": {"name": "time", "args": {}, "id": "g-7"},
            "thoughtSignature": gemini_wire.UNSIGNED,  # none given: Google's placeholder
        },
    ]
    # both answers and the next words in one user turn, answering by name (and Gemini's id)
    assert answers == {
        "role": "user",
        "parts": [
            {"functionResponse": {"name": "weather", "response": {"temp": 21}}},
            {"functionResponse": {"name": "time", "response": {"result": "noon"}, "id": "g-7"}},
            {"text": "thanks"},
        ],
    }


def test_replies_usage_logprobs_and_finish_reasons() -> None:
    reply = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "a"}, {"text": "b"}]},
                "finishReason": "MAX_TOKENS",
                "index": 0,
                "logprobsResult": {
                    "chosenCandidates": [{"token": "a", "logProbability": -0.5}],
                    "topCandidates": [
                        {
                            "candidates": [
                                {"token": "a", "logProbability": -0.5},
                                {"token": "é", "logProbability": -1.5},
                            ]
                        }
                    ],
                },
            },
            {"content": {"parts": [{"text": "no"}]}, "finishReason": "SAFETY", "index": 1},
            {"content": {"parts": [{"text": "odd"}]}, "finishReason": "OTHER", "index": 2},
        ],
        "usageMetadata": {
            "promptTokenCount": 100,
            "cachedContentTokenCount": 60,
            "candidatesTokenCount": 7,
            "thoughtsTokenCount": 20,
            "totalTokenCount": 127,
        },
        "responseId": "resp-9",
    }
    chat = chat_reply(reply, "gem")
    assert chat["id"] == "chatcmpl-resp-9" and chat["model"] == "gem"
    assert [c["finish_reason"] for c in chat["choices"]] == ["length", "content_filter", "stop"]
    assert chat["choices"][0]["message"]["content"] == "ab"
    tokens = chat["choices"][0]["logprobs"]["content"]
    assert tokens[0]["token"] == "a" and tokens[0]["logprob"] == -0.5
    assert tokens[0]["top_logprobs"][1] == {"token": "é", "logprob": -1.5, "bytes": [195, 169]}
    assert chat["choices"][1]["logprobs"] is None
    assert chat["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 27,  # thinking is billed as output
        "total_tokens": 127,
        "prompt_tokens_details": {"cached_tokens": 60},
        "completion_tokens_details": {"reasoning_tokens": 20},
    }


def test_a_prompt_gemini_blocks_is_a_content_policy_refusal() -> None:
    assert blocked({"candidates": [{"content": {"parts": []}}]}) is None
    status, body = blocked({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}) or (0, b"")
    error = json.loads(body)["error"]
    assert status == 400 and error["code"] == "content_policy_violation"
    assert "PROHIBITED_CONTENT" in error["message"]


def test_google_errors_become_openai_errors() -> None:
    raw = json.dumps(
        {"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}
    )
    status, body = error_reply(429, raw.encode())
    assert status == 429
    assert json.loads(body)["error"] == {
        "message": "Quota exceeded",
        "type": "rate_limit_error",
        "param": None,
        "code": "RESOURCE_EXHAUSTED",
    }
    listed = json.dumps([{"error": {"code": 403, "message": "no", "status": "PERMISSION_DENIED"}}])
    assert error_reply(403, listed.encode())[0] == 403
    status, body = error_reply(502, b"<html>bad gateway</html>")
    assert status == 502 and json.loads(body)["error"]["type"] == "server_error"


def test_count_requests_per_cloud() -> None:
    native = generate_request(
        {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "temperature": 1}
    )
    vertex = count_request(native, "vertex", "gemini-2.5-pro")
    assert set(vertex) == {"contents", "tools"}  # no generationConfig: countTokens refuses it
    studio = count_request(native, "", "gemini-2.5-pro")
    assert studio["generateContentRequest"]["model"] == "models/gemini-2.5-pro"
    assert studio["generateContentRequest"]["contents"] == native["contents"]


def _events(writer: ChunkWriter, *datas: dict[str, Any]) -> list[dict[str, Any]]:
    out = b"".join(writer.write(d) for d in datas) + writer.end()
    lines = [line[6:] for line in out.decode().split("\n") if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_stream_events_become_chunks() -> None:
    usage = {"promptTokenCount": 3, "candidatesTokenCount": 2}
    first = {"candidates": [{"content": {"parts": [{"text": "He"}]}}], "responseId": "s1"}
    call = {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}, "thoughtSignature": "S"}
    last = {
        "candidates": [{"content": {"parts": [{"text": "llo"}, call]}, "finishReason": "STOP"}],
        "usageMetadata": usage,
        "responseId": "s1",
    }
    chunks = _events(ChunkWriter("gem", include_usage=True), first, last)
    assert {c["id"] for c in chunks} == {"chatcmpl-s1"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "He"}
    delta = chunks[1]["choices"][0]["delta"]
    assert delta["content"] == "llo"
    assert delta["tool_calls"][0]["index"] == 0 and delta["tool_calls"][0]["id"].endswith("~sig~S")
    assert chunks[2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 2
    without = _events(ChunkWriter("gem", include_usage=False), first, last)
    assert all("usage" not in c for c in without)


def test_stream_refusals_and_a_stream_that_stops_short() -> None:
    with pytest.raises(StreamRefusal) as err:
        ChunkWriter("gem", True).write({"error": {"code": 503, "message": "overloaded"}})
    assert err.value.status == 503
    with pytest.raises(StreamRefusal) as err:
        ChunkWriter("gem", True).write({"promptFeedback": {"blockReason": "SAFETY"}})
    assert err.value.status == 400
    writer = ChunkWriter("gem", True)
    writer.write({"candidates": [{"content": {"parts": [{"text": "cut"}]}}]})
    with pytest.raises(UpstreamBroken):  # no finish reason: the stream did not end, it broke
        writer.end()
