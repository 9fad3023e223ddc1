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

KINDS = ("email", "phone", "credit_card", "iban", "us_ssn", "ip_address", "secret", "blocklist")
PREFIX = "pii/"  # the category a kind is audited and counted under: pii/email, ...

_SECRETS = "|".join(
    (
        r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic
        r"\bAKIA[0-9A-Z]{16}\b",  # AWS access key id
        r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",  # GitHub
        r"\bxox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
        r"\bAIza[0-9A-Za-z_-]{35}",  # Google API key
        r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JSON Web Token
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
        r"\bty-[A-Za-z0-9_-]{20,}",  # this platform's team keys
    )
)
_PATTERNS = {
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"),
    "credit_card": re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"),
    "iban": re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b"),
    "us_ssn": re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"),
    "ip_address": re.compile(
        r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])|(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"
    ),
    "secret": re.compile(_SECRETS, re.DOTALL),
}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


_CHECKS: dict[str, Callable[[str], bool]] = {
    "credit_card": lambda s: luhn.is_valid(re.sub(r"[ -]", "", s)),
    "iban": iban.is_valid,
    "us_ssn": ssn.is_valid,
    "ip_address": _is_ip,
}


@dataclass(frozen=True)
class Found:
    kind: str
    start: int
    end: int


def _candidates(text: str, kinds: frozenset[str], region: str | None) -> Iterator[Found]:
    for kind, pattern in _PATTERNS.items():
        if kind not in kinds:
            continue
        check = _CHECKS.get(kind)
        for match in pattern.finditer(text):
            if check is None or check(match.group()):
                yield Found(kind, match.start(), match.end())
    if "phone" in kinds:
        for match in phonenumbers.PhoneNumberMatcher(text, region):
            yield Found("phone", match.start, match.end)


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


def mask(text: str, found: list[Found], kinds: frozenset[str]) -> str:
    """The text with each found span of `kinds` replaced by its kind in brackets: [EMAIL]
    ([REDACTED] for a blocklisted term: its kind would name nothing)."""
    parts, at = [], 0
    for span in found:
        if span.kind in kinds:
            label = "REDACTED" if span.kind == "blocklist" else span.kind.upper()
            parts += [text[at : span.start], f"[{label}]"]
            at = span.end
    return "".join(parts) + text[at:]
