"""The gateway's side of the safety layer (core/safety.py): what text a request is screened on, the
refusal a blocked prompt gets, and how a reply that crosses the team's output policy ends.

Nothing here scores anything: the Safety object tapped in by tokenyard/app.py (guard/) does.
"""

from collections.abc import Callable
from typing import Any

import msgspec

from tokenyard.core.errors import GatewayError
from tokenyard.core.messages import content_text
from tokenyard.core.safety import OutputWatch, RequestScreen, Verdict

CONTENT_FILTER = "content_filter"
# the roles whose text is screened: what users and tools put into the conversation (a tool's
# output is where an indirect prompt injection arrives); system and developer turns are the
# deployment's own, assistant turns the model's
SCREENED_ROLES = ("user", "tool", "function")


def input_text(body: dict[str, Any]) -> str:
    """The prompt as the classifier reads it: every user and tool turn (chat), or the prompt
    (completions: a string, or a list of them)."""
    messages = body.get("messages")
    if messages is not None:
        return "\n".join(
            content_text(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") in SCREENED_ROLES
        )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


class InputCheck:
    """One request's input verdict, asked for once however many backends the request tries."""

    def __init__(self, screen: RequestScreen, text: str) -> None:
        self.screen = screen
        self.text = text
        self._verdict: Verdict | None = None

    async def verdict(self) -> Verdict:
        if self._verdict is None:
            self._verdict = await self.screen.check_input(self.text)
        return self._verdict


def blocked_error(verdict: Verdict, direction: str = "input") -> GatewayError:
    """OpenAI's shape for a refused prompt: 400, code content_policy_violation."""
    names = ", ".join(verdict.categories)
    return GatewayError(
        400,
        f"the {direction} was blocked by this team's content policy (categories: {names})",
        code="content_policy_violation",
        param="messages" if direction == "input" else None,
        headers={"x-tokenyard-guard": f"{direction}-blocked:{names}"},
    )


def filter_reply(body: bytes, watch_for: Callable[[], OutputWatch | None]) -> bytes | None:
    """A whole (non-streamed) reply read as a stream would be, choice by choice; a choice that
    crosses a blocking threshold keeps the text checked clean before it and ends with
    finish_reason "content_filter". None: nothing changed."""
    try:
        reply = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(reply, dict) or not isinstance(reply.get("choices"), list):
        return None
    changed = False
    for choice in reply["choices"]:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        holder, key = (message, "content") if isinstance(message, dict) else (choice, "text")
        text = holder.get(key)
        if not isinstance(text, str) or not text:
            continue
        watch = watch_for()
        if watch is None:
            return None
        verdict = None
        stride = 256
        for start in range(0, len(text), stride):
            verdict = watch.feed(text[start : start + stride])
            if verdict is not None:
                break
        if verdict is None:
            verdict = watch.finish()
        if verdict is not None and verdict.blocked:
            holder[key] = text[: watch.passed]
            choice["finish_reason"] = CONTENT_FILTER
            changed = True
    return msgspec.json.encode(reply) if changed else None


def cut_event(meta: dict[str, Any], indexes: list[int], chat: bool) -> bytes:
    """The last event of a stream the output check ended: every choice finishes with
    "content_filter"."""
    choices = [
        {"index": i, "delta": {}, "finish_reason": CONTENT_FILTER}
        if chat
        else {"index": i, "text": "", "finish_reason": CONTENT_FILTER}
        for i in indexes or [0]
    ]
    chunk = {**meta, "choices": choices}
    return b"data: " + msgspec.json.encode(chunk) + b"\n\n"
