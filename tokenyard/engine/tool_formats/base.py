"""What a tool format module provides, and the events its parser yields."""

from dataclasses import dataclass
from typing import Protocol


@dataclass
class Content:
    """Text of the message's content."""

    text: str


@dataclass
class CallStart:
    """A new tool call, to the named function."""

    name: str


@dataclass
class ArgsDelta:
    """More of the current call's arguments (JSON text)."""

    text: str


Event = Content | CallStart | ArgsDelta


class Parser(Protocol):
    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


class ToolFormat(Protocol):
    """A model family's way of writing tool calls; each module of this package is one."""

    NAME: str
    MARKERS: tuple[str, ...]  # text a chat template of this format writes

    def system_prompt(self, tools: list[dict]) -> str: ...

    def render_calls(self, tool_calls: list[dict]) -> str: ...

    def render_result(self, content: str) -> str: ...

    def grammar(self, tools: list[dict], parallel: bool) -> dict: ...

    def Parser(self) -> Parser: ...  # the module's parser class
