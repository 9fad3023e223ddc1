"""Personal data and secrets in a prompt: found, and masked before the prompt leaves the platform.

Deterministic detectors, not the classifier: each kind is a pattern for candidates and a check
that keeps only real ones, so ordinary numbers are left alone:
- `email`: an address (local part, @, a domain with a dotted top-level name);
- `phone`: what libphonenumber (`phonenumbers`) finds valid, in international form or in the
  platform's default region's own (TOKENYARD_GUARD_PII_REGION);
- `credit_card`: 13-19 digits, spaces or dashes between groups, whose Luhn check digit holds;
- `iban`: a country code, check digits and account, valid by ISO 13616's mod-97 (`stdnum`);
- `us_ssn`: ddd-dd-dddd in the number plan the SSA issues (no 000, 666 or 9xx area, ...);
- `ip_address`: IPv4 dotted quads and IPv6 addresses the `ipaddress` module accepts;
- `secret`: credentials by their issuers' published shapes (OpenAI and Anthropic keys, AWS
  access key ids, GitHub, Slack and Google API tokens, JSON Web Tokens, PEM private keys, and
  this platform's own `ty-` keys);
- `blocklist`: the team's own terms (a project's code name, a customer's name), as whole words
  in any case.
The patterns for email, cards, SSNs, IPs and secrets are written here: the libraries that detect
them (Presidio, detect-secrets) need spaCy models or scan files, and none runs offline in a
request's time.
"""

import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import phonenumbers
from stdnum import iban, luhn
from stdnum.us import ssn

from tokenyard.core.safety import placeholder

KINDS = ("email", "phone", "credit_card", "iban", "us_ssn", "ip_address", "secret", "blocklist")
PREFIX = "pii/"  # the category a kind is audited and counted under: pii/email, ...

Check = Callable[[str, "re.Match[str]"], bool]


def _alone(text: str, match: "re.Match[str]") -> bool:
    """Not the tail of a longer word (what a leading \\b says). Checked here, not in the pattern:
    a pattern that starts with a literal is found by a fast substring search, while one that
    starts with \\b or a lookbehind is tried at every position, ~30x slower on a long prompt."""
    i = match.start()
    return i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")


def _apart(text: str, match: "re.Match[str]", joiners: str) -> bool:
    """Neither end touches a word character or one of `joiners` (a longer number, a version)."""
    i, j = match.start(), match.end()
    before = i > 0 and (text[i - 1].isalnum() or text[i - 1] in joiners)
    after = j < len(text) and (text[j].isalnum() or text[j] in joiners)
    return not (before or after)


def _ip(text: str, match: "re.Match[str]") -> bool:
    if not _apart(text, match, "._:") or not any(c.isdigit() or c.isalpha() for c in match[0]):
        return False
    try:
        ipaddress.ip_address(match[0])
    except ValueError:
        return False
    return True


def _digits(valid: Callable[[str], bool]) -> Check:
    """A number apart from other digits and dashes, valid by its check digits or plan."""
    return lambda text, m: _apart(text, m, "-") and valid(m[0])


def _secret(pattern: str) -> tuple["re.Pattern[str]", Check]:
    return re.compile(pattern, re.DOTALL), _alone


# kind → (pattern, check) pairs: candidates, and what keeps the real ones
_DETECTORS: dict[str, tuple[tuple["re.Pattern[str]", Check], ...]] = {
    "email": (
        (
            re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
            _alone,
        ),
    ),
    "credit_card": (
        (
            re.compile(r"\d(?:[ -]?\d){12,18}"),
            _digits(lambda s: luhn.is_valid(re.sub(r"[ -]", "", s))),
        ),
    ),
    "iban": (
        (
            re.compile(r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b"),
            lambda t, m: _alone(t, m) and iban.is_valid(m[0]),
        ),
    ),
    "us_ssn": ((re.compile(r"\d{3}-\d{2}-\d{4}"), _digits(ssn.is_valid)),),
    "ip_address": (
        (re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"), _ip),
        (re.compile(r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:[0-9A-Fa-f:]*"), _ip),
    ),
    "secret": (
        _secret(r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"),  # OpenAI, Anthropic
        _secret(r"AKIA[0-9A-Z]{16}\b"),  # AWS access key id
        _secret(r"gh[pousr]_[A-Za-z0-9]{36,}\b"),  # GitHub
        _secret(r"xox[abprs]-[A-Za-z0-9-]{10,}"),  # Slack
        _secret(r"AIza[0-9A-Za-z_-]{35}"),  # Google API key
        _secret(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JSON Web Token
        _secret(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----"),
        _secret(r"ty-[A-Za-z0-9_-]{20,}"),  # this platform's team keys
    ),
}
# where a phone number may be: 7 or more digits with the separators numbers are written with; the
# matcher (pure Python, ~0.5 us a character) reads only these, with some context each
_PHONE_CANDIDATE = re.compile(r"[+(]?\d[\d\s().\-/]{5,}\d")
_TAIL = 16


@dataclass(frozen=True)
class Found:
    kind: str
    start: int
    end: int


def _phones(text: str, region: str | None) -> Iterator[Found]:
    for candidate in _PHONE_CANDIDATE.finditer(text):
        if sum(c.isdigit() for c in candidate[0]) < 7:
            continue
        # a little context: a character before, and room after for an extension ("ext. 123")
        a, b = max(candidate.start() - 2, 0), min(candidate.end() + _TAIL, len(text))
        for match in phonenumbers.PhoneNumberMatcher(text[a:b], region):
            yield Found("phone", a + match.start, a + match.end)


def _candidates(text: str, kinds: frozenset[str], region: str | None) -> Iterator[Found]:
    for kind, detectors in _DETECTORS.items():
        if kind not in kinds or (kind == "email" and "@" not in text):
            continue
        for pattern, check in detectors:
            for match in pattern.finditer(text):
                if check(text, match):
                    yield Found(kind, match.start(), match.end())
    if "phone" in kinds:
        yield from _phones(text, region)


@lru_cache(maxsize=256)
def _terms(terms: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern for a team's terms: escaped (a term is text, never a pattern: no backtracking
    a team could set off), longest first, whole words, any case."""
    alternatives = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def find(
    text: str, kinds: frozenset[str], region: str | None = "US", terms: tuple[str, ...] = ()
) -> list[Found]:
    """The spans of the asked kinds (`blocklist`: of `terms`), in order, none overlapping: where
    two overlap, the one that starts first (then the longer) stands; a card number is not also a
    phone number."""
    candidates = list(_candidates(text, kinds, region))
    if "blocklist" in kinds and terms:
        candidates += [Found("blocklist", m.start(), m.end()) for m in _terms(terms).finditer(text)]
    found: list[Found] = []
    for span in sorted(candidates, key=lambda f: (f.start, -f.end)):
        if not found or span.start >= found[-1].end:
            found.append(span)
    return found


def mask(
    text: str, found: list[Found], kinds: frozenset[str], labels: dict[tuple[str, str], str]
) -> str:
    """The text with each found span of `kinds` replaced by a placeholder, its kind and its number
    in the request: [EMAIL_1] ([REDACTED_1] for a blocklisted term: its kind would name nothing).
    `labels` holds the request's placeholders by (kind, value), shared by all its texts, so one
    value is one placeholder wherever it appears; new ones are added to it."""
    parts, at = [], 0
    for span in found:
        if span.kind in kinds:
            value = text[span.start : span.end]
            label = "REDACTED" if span.kind == "blocklist" else span.kind.upper()
            numbered = sum(1 for kind, _ in labels if kind == span.kind)
            name = labels.setdefault((span.kind, value), placeholder(label, numbered + 1))
            parts += [text[at : span.start], name]
            at = span.end
    return "".join(parts) + text[at:]
