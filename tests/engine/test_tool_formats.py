"""Tool formats: the Hermes parser (tool_choice auto parses free output), streamed in any chunking
to the same message, and the fallback prompt for templates without tools."""

import json
import random

import pytest

from tokenyard.engine.tool_formats import ToolCalls, for_template, hermes, prompt_messages

CALLS = (
    "Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "nested", "arguments": {"a": {"b": [1, "}\\n"]}}}\n</tool_call>'
)


def streamed(text: str, sizes: list[int]) -> tuple[dict, list[dict]]:
    """Feed text in chunks of the given sizes; the message rebuilt from the deltas, and them."""
    parsed, deltas, at = ToolCalls(hermes), [], 0
    for size in sizes:
        deltas.append(parsed.delta(text[at : at + size], False))
        at += size
    deltas.append(parsed.delta(text[at:], True))
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name", "")
            entry["arguments"] += call["function"]["arguments"]
    rebuilt = {"content": content, "calls": list(calls.values())}
    return rebuilt, deltas


def whole(text: str, reason: str = "stop") -> tuple[dict, str | None]:
    parsed = ToolCalls(hermes)
    parsed.delta(text, True)
    return parsed.message(), parsed.finish_reason(reason)


def test_calls_are_parsed_with_content_before_them():
    message, reason = whole(CALLS)
    assert reason == "tool_calls" and message["content"] == "Let me check."
    names = [c["function"]["name"] for c in message["tool_calls"]]
    args = [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]]
    assert names == ["get_weather", "nested"]
    assert args == [{"city": "Paris"}, {"a": {"b": [1, "}\n"]}}]
    assert all(
        c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"]
    )


@pytest.mark.parametrize("seed", range(6))
def test_any_chunking_streams_the_same_message(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 7) for _ in range(len(CALLS))] if seed else [1] * len(CALLS)
    rebuilt, deltas = streamed(CALLS, sizes)
    message, _ = whole(CALLS)
    assert rebuilt["content"].strip() == message["content"]
    assert rebuilt["calls"] == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message["tool_calls"]
    ]
    fragments = [c for d in deltas for c in d.get("tool_calls", []) if c["function"]["arguments"]]
    assert len(fragments) > 4  # arguments arrive as they are generated, not at the end
    assert "<tool_call>" not in rebuilt["content"]


@pytest.mark.parametrize(
    "text",
    [
        "No tools needed: the answer is 4.",
        "A block that is no call: <tool_call> hello </tool_call> after",
        "Ends with the start of a marker <tool_",
        '<tool_call>\n{"arguments": {}, "name": "f"}\n</tool_call>',  # not the format's order
    ],
)
def test_text_that_is_no_call_stays_content(text):
    message, reason = whole(text)
    assert message["content"] == text and "tool_calls" not in message and reason == "stop"
    rebuilt, _ = streamed(text, [3] * (len(text) // 3))
    assert rebuilt == {"content": text, "calls": []}


def test_a_call_cut_short_keeps_its_partial_arguments():
    text = '<tool_call>\n{"name": "f", "arguments": {"city": "Par'
    message, reason = whole(text, "length")
    assert reason == "length"
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'


SMOLLM2_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_templates_pick_their_format():
    assert for_template(SMOLLM2_TEMPLATE) == (hermes, False)
    assert for_template(HERMES_TEMPLATE) == (hermes, True)
    assert for_template(None) == (hermes, False)


def test_fallback_writes_tools_calls_and_results_as_text():
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    out = prompt_messages(hermes, False, history, TOOLS)
    assert out[0]["content"].startswith("Be brief.\n\n") and '"name": "f"' in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    }
    assert out[3] == {"role": "tool", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert prompt_messages(hermes, True, history, TOOLS) is history
    assert prompt_messages(hermes, False, history[1:2], TOOLS)[0]["role"] == "system"
