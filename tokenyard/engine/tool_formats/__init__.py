"""Tool calling on the engine: one module per model family's format (hermes.py, ...), chosen by the
model's chat template; this module picks one, writes tools and tool messages into the prompt, and
turns generated text into OpenAI's message (content, tool_calls), streamed or whole.

Adding a family (Llama 3.x, Mistral, ...) is adding a module with the members of
`base.ToolFormat` and listing it in FORMATS. A template that renders tools itself gets the messages
as OpenAI sends them; one that does not (SmolLM2's) gets the fallback format written into plain
messages: the tool listing in the system message, calls and results as text.
"""

import uuid
from types import ModuleType
from typing import cast

from tokenyard.engine.tool_formats import hermes
from tokenyard.engine.tool_formats.base import ArgsDelta, CallStart, Content, ToolFormat

FORMATS: tuple[ModuleType, ...] = (hermes,)
FALLBACK: ModuleType = hermes


def for_template(template: str | None) -> tuple[ToolFormat, bool]:
    """The format a chat template speaks, and whether it renders tools itself."""
    if template and "tools" in template:
        for fmt in FORMATS:
            if any(marker in template for marker in fmt.MARKERS):
                return cast(ToolFormat, fmt), True
    return cast(ToolFormat, FALLBACK), False


def prompt_messages(
    fmt: ToolFormat, native: bool, messages: list[dict], tools: list[dict] | None
) -> list[dict]:
    """Messages for the chat template. A native template is handed tools and tool messages as
    they are; otherwise the format writes them as text."""
    if native:
        return messages
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            text = fmt.render_calls(message.pop("tool_calls"))
            message["content"] = f"{message['content']}\n{text}" if message["content"] else text
        if message["role"] == "tool":
            message["content"] = fmt.render_result(message["content"])
            message.pop("tool_call_id", None)
        out.append(message)
    if tools:
        listing = fmt.system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{listing}"}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


class ToolCalls:
    """One choice's generated text as OpenAI's assistant message: content and tool_calls."""

    def __init__(self, fmt: ToolFormat):
        self._parser = fmt.Parser()
        self.calls: list[dict] = []
        self._content: list[str] = []

    def delta(self, text: str, finished: bool) -> dict:
        """A streamed chunk's delta for this text (what is held back comes later)."""
        events = self._parser.feed(text) + (self._parser.finish() if finished else [])
        content, calls = "", []
        for event in events:
            if isinstance(event, Content):
                content += event.text
            elif isinstance(event, CallStart):
                call = {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": event.name, "arguments": ""},
                }
                self.calls.append(call)
                calls.append(
                    {"index": len(self.calls) - 1, **call, "function": {**call["function"]}}
                )
            elif isinstance(event, ArgsDelta):
                self.calls[-1]["function"]["arguments"] += event.text
                if calls and calls[-1]["index"] == len(self.calls) - 1:
                    calls[-1]["function"]["arguments"] += event.text
                else:
                    calls.append(
                        {"index": len(self.calls) - 1, "function": {"arguments": event.text}}
                    )
        self._content.append(content)
        delta: dict = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if self.calls and reason == "stop" else reason

    def message(self) -> dict:
        """The whole message (after every delta has been taken)."""
        content = "".join(self._content)
        message: dict = {"role": "assistant", "refusal": None}
        if self.calls:
            message["content"] = content.strip() or None
            message["tool_calls"] = self.calls
        else:
            message["content"] = content
        return message
