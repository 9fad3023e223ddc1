"""Hermes-style tool calls (Hermes 2/3, Qwen 2.5 and others; tokenyard's fallback for chat templates
that define no tool format, such as SmolLM2's):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, separated by a newline, any text before them being the message's content.
"""

import json
import re

from tokenyard.engine.tool_formats.base import ArgsDelta, CallStart, Content, Event

NAME = "hermes"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKERS = (OPEN,)  # a chat template that writes this speaks the format
# the call's opening up to its arguments' first character (as the grammar writes it, whitespace
# aside); a block that does not open so within a few hundred characters is text after all
_HEADER = re.compile(
    r'\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"\s*,\s*"arguments"\s*:\s*(?=\S)'
)
_HEADER_WAIT = 256


def system_prompt(tools: list[dict]) -> str:
    """The tool listing for a template that cannot render tools itself."""
    listing = "\n".join(json.dumps(t["function"]) for t in tools)
    return (
        "You may call one or more functions to answer. The functions, as JSON schemas:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "For each call, reply with a JSON object holding the function's name and arguments inside "
        f'{OPEN}{CLOSE} tags:\n{OPEN}\n{{"name": <function-name>, "arguments": <args-object>}}\n'
        f"{CLOSE}"
    )


def render_calls(tool_calls: list[dict]) -> str:
    """An assistant message's tool_calls as the model would have written them."""
    blocks = []
    for call in tool_calls:
        function = call.get("function", {})
        arguments = function.get("arguments") or "{}"
        name = json.dumps(function.get("name", ""))
        blocks.append(f'{OPEN}\n{{"name": {name}, "arguments": {arguments}}}\n{CLOSE}')
    return "\n".join(blocks)


def render_result(content: str) -> str:
    """A tool message's content, as the model is shown it."""
    return f"<tool_response>\n{content}\n</tool_response>"


def grammar(tools: list[dict], parallel: bool) -> dict:
    """An xgrammar structural tag: one call or more (one only unless parallel) of the given tools,
    arguments by each function's `parameters`, nothing else."""
    tags = [
        {
            "type": "tag",
            "begin": f'{OPEN}\n{{"name": {json.dumps(t["function"]["name"])}, "arguments": ',
            "content": {
                "type": "json_schema",
                "json_schema": t["function"].get("parameters") or {"type": "object"},
                "max_whitespace_cnt": 1,  # a small model offered free whitespace may loop in it
            },
            "end": "}\n" + CLOSE,
        }
        for t in tools
    ]
    return {
        "type": "structural_tag",
        "format": {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not parallel,
        },
    }


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that begins the marker (it may be completed later)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class Parser:
    """Text as it streams in → content and tool-call events. Each event's text is final: what is
    streamed concatenates to what a non-streamed reply holds."""

    def __init__(self) -> None:
        self._buffer = ""  # text not yet turned into events
        self._in_call = False
        self._header_done = False
        self._args_sent = 0  # characters of the current call's arguments already sent

    def feed(self, text: str) -> list[Event]:
        self._buffer += text
        events: list[Event] = []
        while True:
            before = (self._in_call, self._header_done, len(self._buffer))
            events += self._call() if self._in_call else self._text()
            if (self._in_call, self._header_done, len(self._buffer)) == before:
                return events

    def finish(self) -> list[Event]:
        """The output ended: whatever is held back is released."""
        if not self._in_call:
            events = [Content(self._buffer)] if self._buffer else []
        elif self._header_done:  # cut short (max_tokens): its arguments are incomplete
            events = [ArgsDelta(self._buffer[self._args_sent :])]
        else:
            events = [Content(OPEN + self._buffer)]
        self._buffer = ""
        return events

    def _text(self) -> list[Event]:
        start = self._buffer.find(OPEN)
        if start >= 0:
            content, self._buffer = self._buffer[:start], self._buffer[start + len(OPEN) :]
            self._in_call, self._header_done = True, False
        else:
            keep = _partial_suffix(self._buffer, OPEN)
            content = self._buffer[: len(self._buffer) - keep]
            self._buffer = self._buffer[len(content) :]
        return [Content(content)] if content else []

    def _call(self) -> list[Event]:
        events: list[Event] = []
        if not self._header_done:
            match = _HEADER.match(self._buffer)
            if match is None:
                if CLOSE in self._buffer or len(self._buffer) > _HEADER_WAIT:  # not a call
                    text, self._buffer, self._in_call = OPEN + self._buffer, "", False
                    return [Content(text)]
                return []
            self._buffer = self._buffer[match.end() :]
            self._header_done, self._args_sent = True, 0
            events.append(CallStart(match.group(1)))
        end = self._buffer.find(CLOSE)
        if end >= 0:
            # the arguments end before the object's closing brace
            args = self._buffer[:end].rstrip().removesuffix("}").rstrip()
            self._buffer = self._buffer[end + len(CLOSE) :].lstrip("\n")
            self._in_call = False
        else:
            # hold back what may be the object's closing brace, whitespace or a partial CLOSE
            held = self._buffer[: len(self._buffer) - _partial_suffix(self._buffer, CLOSE)]
            args = held.rstrip("} \t\r\n")
        if len(args) > self._args_sent:
            events.append(ArgsDelta(args[self._args_sent :]))
            self._args_sent = len(args)
        return events
