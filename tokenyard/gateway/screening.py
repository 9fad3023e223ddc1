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
    spoken = body.get("input")  # a speech request's text
    return spoken if isinstance(spoken, str) else ""


def _places(body: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Where a request body holds screened text, as (container, key): chat's user and tool turns
    (a string, or text parts), a completion's prompt (a string, or strings), a Responses request's
    input (a string, user turns' text, function outputs)."""
    places: list[tuple[Any, Any]] = []

    def content(holder: dict[str, Any], key: str, part_types: tuple[str, ...]) -> None:
        value = holder.get(key)
        if isinstance(value, str):
            places.append((holder, key))
        elif isinstance(value, list):
            places.extend(
                (part, "text")
                for part in value
                if isinstance(part, dict)
                and part.get("type") in part_types
                and isinstance(part.get("text"), str)
            )

    for m in body.get("messages") or ():
        if isinstance(m, dict) and m.get("role") in SCREENED_ROLES:
            content(m, "content", ("text",))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        places.append((body, "prompt"))
    elif isinstance(prompt, list):
        places += [(prompt, i) for i, p in enumerate(prompt) if isinstance(p, str)]
    items = body.get("input")
    if isinstance(items, str):
        places.append((body, "input"))
    elif isinstance(items, list):
        for item in items:
            if not isinstance(item, dict):
                continue
            if item.get("role") == "user":
                content(item, "content", ("input_text", "text"))
            elif item.get("type") == "function_call_output" and isinstance(item.get("output"), str):
                places.append((item, "output"))
    return places


async def scrub(screen: RequestScreen, *bodies: dict[str, Any] | None) -> None:
    """Mask the personal data the team masks in each body, in place (the chat body, and a Responses
    request going to OpenAI as it is); raises the refusal when a kind the team blocks is there."""
    places = [place for body in bodies if body is not None for place in _places(body)]
    if not places:
        return
    masked, verdict = await screen.scrub([holder[key] for holder, key in places])
    if verdict.blocked:
        raise blocked_error(verdict)
    for (holder, key), text in zip(places, masked, strict=True):
        holder[key] = text


class InputCheck:
    """One request's input verdict, asked for once however many backends the request tries."""

    def __init__(self, screen: RequestScreen, text: str, first: bool = False) -> None:
        self.screen = screen
        self.text = text
        # the verdict before the upstream call, not beside it: where what a cancelled call still
        # costs (an image begun) outweighs the classifier's milliseconds
        self.first = first
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
