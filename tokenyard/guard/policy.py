"""Per-team safety policy: for each direction (input, output) and head, off, flag or block, with a
threshold (None: the classifier's own default for that head, set at training time); and for each
kind of personal data or secret in a prompt (guard/pii.py), off, flag, block or mask.

The platform default (a team with no policy of its own) flags every category both ways and the
jailbreak class on input, and blocks only sexual content involving minors: flags cost a team
nothing but an audit row, while a wrong block costs a user their answer; a team that wants more
blocking says so (`tokenyard guard policy set TEAM input.violence=block`, or the admin UI).
Personal data is not looked for unless a team asks (`pii.email=mask`): an address in a prompt is
often the point of the prompt.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from tokenyard.guard.pii import KINDS
from tokenyard.guard.taxonomy import CATEGORIES, JAILBREAK

ACTIONS = ("off", "flag", "block")
DIRECTIONS = ("input", "output")
Action = Literal["off", "flag", "block"]
PII = "pii"  # the settings' namespace for personal data: pii.email=mask
PII_ACTIONS = ("off", "flag", "block", "mask")
MAX_TERMS = 500
MAX_TERM = 200
PiiAction = Literal["off", "flag", "block", "mask"]


def heads_of(direction: str) -> tuple[str, ...]:
    """Jailbreak and prompt injection are an input's concern only."""
    return (*CATEGORIES, JAILBREAK) if direction == "input" else CATEGORIES


class Rule(msgspec.Struct, frozen=True):
    action: Action = "flag"
    threshold: float | None = None  # None: the classifier's default for the head


def _defaults(direction: str) -> dict[str, Rule]:
    rules = {head: Rule("flag") for head in heads_of(direction)}
    rules["sexual/minors"] = Rule("block")
    return rules


class Policy(msgspec.Struct, frozen=True):
    input: dict[str, Rule] = msgspec.field(default_factory=lambda: _defaults("input"))
    output: dict[str, Rule] = msgspec.field(default_factory=lambda: _defaults("output"))
    store_text: bool = False  # audit rows keep the text that was flagged (opt-in)
    pii: dict[str, PiiAction] = msgspec.field(default_factory=dict)  # kind → action; absent: off
    terms: tuple[str, ...] = ()  # the team's own blocklist (pii.blocklist sets what it does)

    def rules(self, direction: str) -> dict[str, Rule]:
        return self.input if direction == "input" else self.output

    def active(self, direction: str) -> bool:
        return any(r.action != "off" for r in self.rules(direction).values())

    def pii_kinds(self, *actions: str) -> frozenset[str]:
        """The kinds of personal data the team acts on with one of `actions` (any, if none)."""
        return frozenset(
            k for k, a in self.pii.items() if a != "off" and (not actions or a in actions)
        )


DEFAULT = Policy()
_decoder = msgspec.json.Decoder(Policy)


def decode(raw: str | bytes | None) -> Policy:
    if not raw:
        return DEFAULT
    policy = _decoder.decode(raw)
    check(policy)
    return policy


def encode(policy: Policy) -> str:
    return msgspec.json.encode(policy).decode()


def check(policy: Policy) -> None:
    for direction in DIRECTIONS:
        allowed = heads_of(direction)
        for head, rule in policy.rules(direction).items():
            if head not in allowed:
                raise ValueError(f"{direction} has no category {head!r} (one of {allowed})")
            if rule.action not in ACTIONS:
                raise ValueError(f"action must be one of {ACTIONS}")
            if rule.threshold is not None and not 0.0 < rule.threshold < 1.0:
                raise ValueError(f"{direction}.{head}: threshold must be between 0 and 1")
    if len(policy.terms) > MAX_TERMS:
        raise ValueError(f"a blocklist holds at most {MAX_TERMS} terms")
    for term in policy.terms:
        if not 0 < len(term) <= MAX_TERM or term != term.strip():
            raise ValueError(f"a term is 1 to {MAX_TERM} characters, without spaces around")
    for kind, action in policy.pii.items():
        if kind not in KINDS:
            raise ValueError(f"pii has no kind {kind!r} (one of {KINDS})")
        if action not in PII_ACTIONS:
            raise ValueError(f"pii.{kind}: action must be one of {PII_ACTIONS}")


@dataclass
class Change:
    """One `direction.category=action[@threshold]` setting, as the CLI and admin UI give it."""

    direction: str
    head: str
    action: str
    threshold: float | None = None
    clear_threshold: bool = field(default=False)


def parse_change(spec: str) -> Change:
    """`input.violence=block@0.8`, `output.hate=flag`, `input.jailbreak=off`, `*.illicit=block`
    (both directions), `input.*=flag` (every head of a direction), `pii.email=mask`, `pii.*=flag`
    (personal data in prompts)."""
    target, sep, value = spec.partition("=")
    direction, dot, head = target.partition(".")
    if not sep or not dot:
        raise ValueError(f"expected direction.category=action[@threshold], got {spec!r}")
    action, at, threshold = value.partition("@")
    if direction == PII:
        if action not in PII_ACTIONS or at:
            raise ValueError(f"pii.{head}: action must be one of {PII_ACTIONS}, no threshold")
        if head not in (*KINDS, "*"):
            raise ValueError(f"pii has no kind {head!r} (one of {KINDS})")
        return Change(PII, head, action)
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
    if direction not in (*DIRECTIONS, "*"):
        raise ValueError(f"direction must be input, output, * or pii, got {direction!r}")
    change = Change(direction, head, action)
    if at:
        change.threshold = float(threshold)
        if not 0.0 < change.threshold < 1.0:
            raise ValueError("threshold must be between 0 and 1")
    return change


def terms_of(raw: list[str]) -> tuple[str, ...]:
    """A blocklist as people give it (a term a line, or a flag each): trimmed, blanks and
    repeats (in any case) dropped, in order."""
    kept: dict[str, str] = {}
    for term in (t.strip() for t in raw):
        if term:
            kept.setdefault(term.casefold(), term)
    return tuple(kept.values())


def apply(
    policy: Policy,
    changes: list[Change],
    store_text: bool | None = None,
    terms: tuple[str, ...] | None = None,
) -> Policy:
    rules: dict[str, dict[str, Rule]] = {d: dict(policy.rules(d)) for d in DIRECTIONS}
    pii = dict(policy.pii)
    for change in changes:
        if change.direction == PII:
            for kind in KINDS if change.head == "*" else (change.head,):
                pii[kind] = change.action  # type: ignore[assignment]
            continue
        directions = DIRECTIONS if change.direction == "*" else (change.direction,)
        for direction in directions:
            heads = heads_of(direction)
            targets = heads if change.head == "*" else (change.head,)
            for head in targets:
                if head not in heads:
                    if change.direction == "*":
                        continue  # jailbreak on output: not a thing, skipped for "*"
                    raise ValueError(f"{direction} has no category {head!r} (one of {heads})")
                old = rules[direction].get(head, Rule("off"))
                threshold = old.threshold if change.threshold is None else change.threshold
                rules[direction][head] = Rule(change.action, threshold)  # type: ignore[arg-type]
    new = Policy(
        input=rules["input"],
        output=rules["output"],
        store_text=policy.store_text if store_text is None else store_text,
        pii={kind: action for kind, action in pii.items() if action != "off"},
        terms=policy.terms if terms is None else terms,
    )
    check(new)
    return new


def as_table(policy: Policy, defaults: dict[str, float]) -> list[dict[str, Any]]:
    """Rows for people: direction, category, action, threshold (and whether it is the default)."""
    out = []
    for direction in DIRECTIONS:
        for head in heads_of(direction):
            rule = policy.rules(direction).get(head, Rule("off"))
            out.append(
                {
                    "direction": direction,
                    "category": head,
                    "action": rule.action,
                    "threshold": rule.threshold
                    if rule.threshold is not None
                    else defaults.get(head),
                    "default_threshold": rule.threshold is None,
                }
            )
    for kind in KINDS:
        action = policy.pii.get(kind, "off")
        out.append(
            {
                "direction": PII,
                "category": kind,
                "action": action,
                "threshold": None,
                "default_threshold": False,
            }
        )
    return out
