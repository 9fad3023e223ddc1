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


def response_event(kind: str, sequence: int, **fields: object) -> bytes:
    return b"data: " + msgspec.json.encode({"type": kind, "sequence_number": sequence, **fields})


def test_openais_own_responses_get_their_values_back_whole_and_streamed() -> None:
    """A Responses object's messages, refusals and function-call arguments; and its events, whose
    deltas hold a split placeholder back as a chat chunk's do. What is still held when a text's
    `.done` event comes goes out as one more delta just before it, and the later events' sequence
    numbers move up by one, so a client sees every number once, in order."""
    message = {
        "type": "message",
        "content": [
            {"type": "output_text", "text": "to [EMAIL_1]"},
            {"type": "refusal", "refusal": "not [EMAIL_1]"},
        ],
    }
    call = {"type": "function_call", "arguments": '{"k": "[SECRET_1]"}'}
    body = {"object": "response", "output": [message, call], "usage": {"input_tokens": 3}}
    got = msgspec.json.decode(Unmasker(MASKED).reply(msgspec.json.encode(body)))
    text, refusal = got["output"][0]["content"]
    assert (text["text"], refusal["refusal"]) == ("to jo@example.org", "not jo@example.org")
    assert json.loads(got["output"][1]["arguments"]) == {"k": MASKED["[SECRET_1]"]}

    unmask = Unmasker(MASKED)
    where = {"item_id": "m", "output_index": 0, "content_index": 0}
    stream = [
        response_event("response.output_text.delta", 0, delta="to [EMA", **where),
        response_event("response.output_text.delta", 1, delta="IL_1] and [EM", **where),
        response_event("response.output_text.done", 2, text="to [EMAIL_1] and [EM", **where),
        response_event("response.output_item.done", 3, output_index=0, item=message),
        response_event("response.completed", 4, response=body),
    ]
    out = b"\n\n".join(unmask.event(e) for e in stream).split(b"\n\n")
    events = [msgspec.json.decode(e.removeprefix(b"data: ")) for e in out]
    assert [e["type"].rsplit(".", 1)[-1] for e in events[:4]] == ["delta"] * 3 + ["done"]
    deltas = "".join(e["delta"] for e in events[:3])
    assert deltas == events[3]["text"] == "to jo@example.org and [EM"
    assert [e["sequence_number"] for e in events] == list(range(6))
    assert events[4]["item"]["content"][0]["text"] == "to jo@example.org"
    assert events[5]["response"]["output"][1]["arguments"] == got["output"][1]["arguments"]

    arguments = Unmasker(MASKED)
    kind = "response.function_call_arguments"
    first = arguments.event(response_event(f"{kind}.delta", 0, output_index=1, delta='{"k": "[SEC'))
    rest = arguments.event(response_event(f"{kind}.delta", 1, output_index=1, delta='RET_1]"}'))
    pieces = [msgspec.json.decode(e.removeprefix(b"data: "))["delta"] for e in (first, rest)]
    assert json.loads("".join(pieces)) == {"k": MASKED["[SECRET_1]"]}
