"""The seam between the gateway's walk and the safety layer (guard/, above the gateway): what a
request's screening looks like from below. tokenyard/app.py hands guard's implementation to the
Proxy, as it hands billing's Pricer; None (no guard) costs the walk nothing.

One request: `Safety.screen(team, request_id, model)` returns a RequestScreen (or None: the team's
policy checks nothing). The proxy has the prompt's personal data masked (`scrub`) before anything
is sent, starts the upstream call, then awaits `check_input` (the verdict comes while the upstream
works; nothing reaches the client before it). A streamed or whole reply is fed to
`watch_output()`'s OutputWatch, which answers a blocking Verdict once the text crosses a threshold
the team blocks on.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

Action = Literal["allow", "flag", "block"]
Direction = Literal["input", "output"]


@dataclass(frozen=True)
class Verdict:
    action: Action = "allow"
    categories: tuple[str, ...] = ()  # the categories over the team's thresholds (flag or block)
    scores: Mapping[str, float] = field(default_factory=dict)

    @property
    def blocked(self) -> bool:
        return self.action == "block"


ALLOW = Verdict()


class OutputWatch(Protocol):
    """One reply's output check: text arrives in pieces as it streams."""

    def feed(self, text: str) -> Verdict | None:
        """Take the next piece of the reply; a blocking Verdict once the reply violates the team's
        policy (the piece is then not to be sent), else None."""
        ...

    def finish(self) -> Verdict | None:
        """The reply ended: check what is still unchecked."""
        ...

    @property
    def passed(self) -> int:
        """Characters of the reply checked and clean so far."""
        ...


# A masked value in a prompt, as the model sees it: its kind and its number in the request,
# `[EMAIL_1]`; the gateway puts the value back where the reply repeats it (gateway/unmasking.py)
PLACEHOLDER = re.compile(r"\[[A-Z][A-Z_]*_[0-9]+\]")


def placeholder(label: str, number: int) -> str:
    return f"[{label}_{number}]"


class RequestScreen(Protocol):
    async def scrub(self, texts: list[str]) -> tuple[list[str], Verdict]:
        """Personal data in the prompt's texts, before anything is sent: the texts with what the
        team masks replaced by placeholders, and the verdict of what it flags or blocks (block:
        refuse)."""
        ...

    @property
    def masked(self) -> Mapping[str, str]:
        """What scrub replaced: each placeholder and the value it stands for."""
        ...

    async def check_input(self, text: str) -> Verdict: ...

    def watch_output(self) -> OutputWatch | None: ...


class Safety(Protocol):
    async def screen(
        self, team: str, request_id: str, model: str, end_user: str | None = None
    ) -> RequestScreen | None: ...
