"""OpenAI chat ⇄ Bedrock's Converse translation (backends/converse_wire.py, through Anthropic's
shapes), without a server: requests, replies, and stream frames built as AWS frames them."""

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.backends.fake_bedrock import frame
from tests.backends.test_backends_gemini_wire import TOOL
from tokenyard.backends.anthropic_wire import ChunkWriter, StreamError, chat_chunks, chat_reply
from tokenyard.backends.base import UpstreamBroken
from tokenyard.backends.converse_wire import anthropic_message, converse_request, events
from tokenyard.core.errors import GatewayError


def test_a_chat_request_becomes_a_converse_body() -> None:
    body = {
        "model": "llama",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                ],
            },
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
            {"role": "tool", "tool_call_id": "call_1", "content": ""},
            {"role": "user", "content": "and tomorrow?"},
        ],
        "max_tokens": 64,
        "temperature": 1.5,
        "top_p": 0.9,
        "stop": ["END"],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "user": "u1",
        "top_k": 5,
    }
    out = converse_request(body)
    assert out["system"] == [{"text": "Be brief."}]
    assert out["inferenceConfig"] == {
        "maxTokens": 64,
        "temperature": 1.0,  # capped, as Bedrock's models take 0..1
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    user, assistant, results = out["messages"]
    assert user == {
        "role": "user",
        "content": [
            {"text": "What is this?"},
            {"image": {"format": "jpeg", "source": {"bytes": "QUJD"}}},
        ],
    }
    # the empty text dropped (Converse refuses one); the call as a toolUse block
    assert assistant == {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "call_1", "name": "weather", "input": {"city": "Oslo"}}}
        ],
    }
    # tool results and the next words in one user turn: Converse wants turns to alternate
    assert results["role"] == "user" and results["content"] == [
        {"toolResult": {"toolUseId": "call_1", "content": [{"json": {"temp": 3}}]}},
        {"toolResult": {"toolUseId": "call_1", "content": [{"text": "(no output)"}]}},
        {"text": "and tomorrow?"},
    ]
    assert out["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "inputSchema": {"json": TOOL["function"]["parameters"]},
                    "description": "the weather in a city",
                }
            }
        ],
        "toolChoice": {"tool": {"name": "weather"}},
    }
    assert set(out) == {"messages", "system", "inferenceConfig", "toolConfig"}  # nothing else
    for choice, converse in (("auto", {"auto": {}}), ("required", {"any": {}})):
        asked = {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
        got = converse_request({**asked, "tool_choice": choice})["toolConfig"]["toolChoice"]
        assert got == converse


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [TOOL], "tool_choice": "none"}, "tool_choice"),
        ({"tools": [TOOL], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "tools"),
    ],
)
def test_what_converse_cannot_do_is_a_400(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        converse_request({"messages": [{"role": "user", "content": "hi"}], **extra})
    assert err.value.status == 400 and err.value.param == param


def test_images_by_url_are_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x.test/cat.png"}}
    with pytest.raises(GatewayError):
        converse_request({"messages": [{"role": "user", "content": [image]}]})


def test_a_reply_becomes_a_chat_completion() -> None:
    reply = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"reasoningContent": {"reasoningText": {"text": "hmm"}}},
                    {"text": "Checking."},
                    {
                        "toolUse": {
                            "toolUseId": "tu_1",
                            "name": "weather",
                            "input": {"city": "Rome"},
                        }
                    },
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 5, "cacheReadInputTokens": 30},
    }
    chat = chat_reply(anthropic_message(reply), "llama")
    message = chat["choices"][0]["message"]
    assert message["content"] == "Checking."
    assert message["tool_calls"] == [
        {
            "id": "tu_1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
        }
    ]
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"]["prompt_tokens"] == 40 and chat["usage"]["completion_tokens"] == 5
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 30
    guarded = anthropic_message(
        {"output": {"message": {"content": []}}, "stopReason": "guardrail_intervened"}
    )
    assert chat_reply(guarded, "llama")["choices"][0]["finish_reason"] == "content_filter"


def _event(name: str, payload: dict[str, Any]) -> bytes:
    headers = {":message-type": "event", ":event-type": name, ":content-type": "application/json"}
    return frame(headers, json.dumps(payload).encode())


async def _chunks(raw: bytes, piece: int = 7) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), piece):  # frames split across reads, as a socket splits them
        yield raw[i : i + piece]


async def _read(raw: bytes) -> list[dict[str, Any]]:
    out = b"".join([c async for c in chat_chunks(events(_chunks(raw)), ChunkWriter("m", True))])
    return [json.loads(b[6:]) for b in out.split(b"\n\n") if b.startswith(b"data: {")]


async def test_stream_frames_become_chunks() -> None:
    raw = b"".join(
        [
            _event("messageStart", {"role": "assistant"}),
            _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
            _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "lo"}}),
            _event("contentBlockStop", {"contentBlockIndex": 0}),
            _event(
                "contentBlockStart",
                {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tu_9", "name": "f"}}},
            ),
            _event(
                "contentBlockDelta",
                {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a"'}}},
            ),
            _event(
                "contentBlockDelta",
                {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ": 1}"}}},
            ),
            _event("contentBlockStop", {"contentBlockIndex": 1}),
            _event("messageStop", {"stopReason": "tool_use"}),
            _event("metadata", {"usage": {"inputTokens": 4, "outputTokens": 6}, "metrics": {}}),
        ]
    )
    chunks = await _read(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello"
    calls = [
        d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or ()
    ]
    assert calls[0]["id"] == "tu_9" and calls[0]["function"]["name"] == "f"
    assert "".join(d["function"]["arguments"] for d in calls) == '{"a": 1}'
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert (
        chunks[-1]["usage"]["prompt_tokens"] == 4 and chunks[-1]["usage"]["completion_tokens"] == 6
    )


async def test_stream_exceptions_and_cuts() -> None:
    refused = frame(
        {":message-type": "exception", ":exception-type": "throttlingException"},
        b'{"message": "slow down"}',
    )
    with pytest.raises(StreamError) as err:
        await _read(refused)
    assert err.value.status == 429
    with pytest.raises(StreamError):  # a corrupted frame
        await _read(_event("messageStart", {"role": "assistant"})[:-1] + b"\x00")
    cut = _event("messageStart", {"role": "assistant"}) + _event(
        "messageStop", {"stopReason": "end_turn"}
    )
    with pytest.raises(UpstreamBroken):  # no metadata: the stream never ended
        await _read(cut)


async def test_reasoning_blocks_become_thinking_both_ways() -> None:
    """reasoningContent → reasoning_content and thinking_blocks (signed, unsigned as another
    model gives it, redacted), whole and streamed; sent back, the signed and redacted ones become
    reasoningContent again and the unsigned one is left out (no model could check it)."""
    signed = {"reasoningText": {"text": "hmm", "signature": "sig"}}
    redacted = {"redactedContent": "b3BhcXVl"}
    unsigned = {"reasoningText": {"text": "mine"}}
    reply = {
        "output": {
            "message": {"content": [{"reasoningContent": r} for r in (signed, redacted, unsigned)]}
        },
        "stopReason": "end_turn",
    }
    message = chat_reply(anthropic_message(reply), "claude")["choices"][0]["message"]
    blocks = message["thinking_blocks"]
    assert blocks == [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "redacted_thinking", "data": "b3BhcXVl"},
        {"type": "thinking", "thinking": "mine", "signature": ""},
    ]
    assert message["reasoning_content"] == "hmmmine"
    turns = [{"role": "user", "content": "hi"}, message, {"role": "user", "content": "more"}]
    sent = converse_request({"messages": turns})["messages"][1]["content"]
    assert sent[:2] == [{"reasoningContent": signed}, {"reasoningContent": redacted}]
    assert all("mine" not in json.dumps(b) for b in sent)

    def delta(index: int, reasoning: dict[str, Any]) -> bytes:
        body = {"contentBlockIndex": index, "delta": {"reasoningContent": reasoning}}
        return _event("contentBlockDelta", body)

    raw = b"".join(
        [
            _event("messageStart", {"role": "assistant"}),
            delta(0, {"text": "h"}),
            delta(0, {"text": "mm"}),
            delta(0, {"signature": "sig"}),
            _event("contentBlockStop", {"contentBlockIndex": 0}),
            delta(1, redacted),
            _event("contentBlockStop", {"contentBlockIndex": 1}),
            _event("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"text": "Yes."}}),
            _event("contentBlockStop", {"contentBlockIndex": 2}),
            _event("messageStop", {"stopReason": "end_turn"}),
            _event("metadata", {"usage": {"inputTokens": 1, "outputTokens": 9}, "metrics": {}}),
        ]
    )
    deltas = [c["choices"][0]["delta"] for c in await _read(raw) if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "hmm"
    assert [d["thinking_blocks"] for d in deltas if "thinking_blocks" in d] == [
        blocks[:1],
        blocks[1:2],
    ]
    assert "".join(d.get("content") or "" for d in deltas) == "Yes."


def test_claudes_own_fields_go_beside_converses() -> None:
    """Anthropic's thinking and output_config go as additionalModelRequestFields; a Claude model
    that thinks adaptively takes reasoning_effort as adaptive thinking at that effort."""
    turn = [{"role": "user", "content": "hi"}]
    asked = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    out = converse_request({"messages": turn, **asked})
    assert out["additionalModelRequestFields"] == asked
    effort = converse_request({"messages": turn, "reasoning_effort": "medium"}, adaptive=True)
    assert effort["additionalModelRequestFields"] == {
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "medium"},
    }
    assert "additionalModelRequestFields" not in converse_request({"messages": turn})
