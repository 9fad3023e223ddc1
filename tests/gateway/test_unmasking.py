"""Masked personal data put back in replies (gateway/unmasking.py): whole replies, and streams
whose placeholders arrive split across chunks, in text and in tool-call arguments."""

import json

import msgspec

from tokenyard.gateway.unmasking import Unmasker

MASKED = {"[EMAIL_1]": "jo@example.org", "[SECRET_1]": 'key"with\\quotes\nand a line'}


def event(**choice: object) -> bytes:
    return b"data: " + msgspec.json.encode({"id": "c", "choices": [{"index": 0, **choice}]})


def read(out: bytes) -> dict:
    return msgspec.json.decode(out.removeprefix(b"data: "))["choices"][0]


def test_a_whole_reply_gets_its_values_back() -> None:
    call = {
        "id": "t",
        "type": "function",
        "function": {"name": "f", "arguments": '{"k": "[SECRET_1]"}'},
    }
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"content": "to [EMAIL_1], not [EMAIL_9]", "tool_calls": [call]},
            },
            {"index": 1, "text": "[EMAIL_1]"},
        ],
        "usage": {"prompt_tokens": 3},
    }
    got = msgspec.json.decode(Unmasker(MASKED).reply(msgspec.json.encode(body)))
    message = got["choices"][0]["message"]
    assert message["content"] == "to jo@example.org, not [EMAIL_9]"  # not one of the request's
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "k": MASKED["[SECRET_1]"]
    }
    assert got["choices"][1]["text"] == "jo@example.org" and got["usage"] == body["usage"]


def test_a_placeholder_split_across_chunks_is_held_until_whole() -> None:
    unmask = Unmasker(MASKED)
    pieces = ["write to [EMA", "IL", "_1] now [", "x] and [E", "MAIL_1"]
    sent = [read(unmask.event(event(delta={"content": p})))["delta"]["content"] for p in pieces]
    assert sent == ["write to ", "", "jo@example.org now ", "[x] and ", ""]
    last = read(unmask.event(event(delta={}, finish_reason="stop")))
    assert last["delta"]["content"] == "[EMAIL_1"  # never completed: sent as it was
    assert (
        "".join(sent) + last["delta"]["content"] == "write to jo@example.org now [x] and [EMAIL_1"
    )


def test_tool_call_arguments_and_legacy_text_stream_back() -> None:
    unmask = Unmasker(MASKED)
    head = {
        "tool_calls": [
            {"index": 0, "id": "t", "function": {"name": "f", "arguments": '{"k": "[SEC'}}
        ]
    }
    tail = {"tool_calls": [{"index": 0, "function": {"arguments": 'RET_1]"}'}}]}
    first = read(unmask.event(event(delta=head)))["delta"]["tool_calls"][0]["function"]["arguments"]
    second = read(unmask.event(event(delta=tail, finish_reason="tool_calls")))
    arguments = first + second["delta"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"k": MASKED["[SECRET_1]"]}
    held = read(
        unmask.event(event(delta={"tool_calls": [{"index": 0, "function": {"arguments": "[EM"}}]}))
    )
    assert held["delta"]["tool_calls"][0]["function"]["arguments"] == ""
    end = read(unmask.event(event(delta={}, finish_reason="tool_calls")))
    assert end["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": "[EM"}}]
    legacy = Unmasker(MASKED)
    assert read(legacy.event(event(text="mail [EMAIL")))["text"] == "mail "
    assert (
        read(legacy.event(event(text="_1]!", finish_reason="length")))["text"] == "jo@example.org!"
    )
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 1}}'
    assert legacy.event(usage) == usage and legacy.event(b"data: [DONE]") == b"data: [DONE]"
