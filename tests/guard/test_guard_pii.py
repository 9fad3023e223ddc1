"""Personal data and secrets in prompts: each kind found where it is real and left alone where it
only looks like it (check digits, number plans, libphonenumber's rules), masked in place, set per
team; in a real gateway, masked before the upstream sees the prompt, or refused before any call."""

import json
from typing import Any

import openai
import pytest
import sqlmodel
from sqlmodel import Session

from tests.gateway.conftest import MODEL, upstream_stats, wait_until
from tokenyard.guard import pii, store
from tokenyard.guard.models import GuardAudit
from tokenyard.guard.policy import (
    DEFAULT,
    MAX_TERMS,
    apply,
    as_table,
    decode,
    encode,
    parse_change,
    terms_of,
)

ALL = frozenset(pii.KINDS)
# (text, the kinds found in it): real ones, and look-alikes that are not
CASES = [
    ("write to ana.lopez+work@mail.example.co.uk today", ["email"]),
    ("an @ sign alone, user@localhost, a@b", []),
    ("call (415) 555-2671 or +44 20 7946 0958", ["phone", "phone"]),
    ("order 123456 shipped in 2024, 3 items at 19.99", []),
    ("card 4111 1111 1111 1111 exp 12/29", ["credit_card"]),
    ("card 4111 1111 1111 1112 is a typo", []),  # the Luhn digit fails
    ("IBAN GB82 WEST 1234 5698 7654 32 please", ["iban"]),
    ("IBAN GB82 WEST 1234 5698 7654 33", []),  # mod 97 fails
    ("ssn 536-22-8726 on file", ["us_ssn"]),
    ("ssn 000-12-3456 and 666-12-3456 are never issued", []),
    ("from 192.168.10.4 and 2001:db8::8a2e:370:7334", ["ip_address", "ip_address"]),
    ("version 1.2.3.4.5 and 999.1.1.1 and 10:30:00", []),
    ("key sk-proj-abcdefghijklmnopqrstuvwxyz123456 leaked", ["secret"]),
    ("AWS AKIAIOSFODNN7EXAMPLE and ghp_" + "a" * 36, ["secret", "secret"]),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", ["secret"]),
    ("the sk- prefix and AKIA alone are fine", []),
]


@pytest.mark.parametrize(("text", "kinds"), CASES)
def test_each_kind_is_found_only_where_it_is_real(text: str, kinds: list[str]) -> None:
    assert [f.kind for f in pii.find(text, ALL)] == kinds


def test_masking_replaces_only_the_kinds_asked_and_never_overlaps() -> None:
    text = "mail bo@example.org, card 4111-1111-1111-1111, phone +1 415 555 2671"
    found = pii.find(text, ALL)
    assert [f.kind for f in found] == ["email", "credit_card", "phone"]
    assert pii.mask(text, found, frozenset({"email", "credit_card"}), {}) == (
        "mail [EMAIL_1], card [CREDIT_CARD_1], phone +1 415 555 2671"
    )
    # only the kinds looked for are found; a number that is a card is not also a phone number
    assert [f.kind for f in pii.find(text, frozenset({"phone"}))] == ["phone"]
    assert pii.mask("no data here", [], ALL, {}) == "no data here"


def test_one_value_is_one_placeholder_across_a_requests_texts() -> None:
    labels: dict[tuple[str, str], str] = {}
    first, second = "to a@example.org and b@example.org", "again b@example.org"
    masked = [pii.mask(t, pii.find(t, ALL), ALL, labels) for t in (first, second)]
    assert masked == ["to [EMAIL_1] and [EMAIL_2]", "again [EMAIL_2]"]
    assert labels == {
        ("email", "a@example.org"): "[EMAIL_1]",
        ("email", "b@example.org"): "[EMAIL_2]",
    }


@pytest.mark.parametrize("text", ["", "\x00\x01" * 50, "数字 ١٢٣٤٥٦٧٨٩ " * 200, "9" * 5000])
def test_odd_text_is_scanned_without_error(text: str) -> None:
    found = pii.find(text, ALL)
    assert pii.mask(text, found, ALL, {}).count("[") >= len(found)


def test_a_policy_sets_each_kind_and_keeps_the_rest() -> None:
    policy = apply(DEFAULT, [parse_change("pii.*=flag"), parse_change("pii.email=mask")])
    assert policy.pii["email"] == "mask" and policy.pii["us_ssn"] == "flag"
    assert policy.pii_kinds("mask") == {"email"} and len(policy.pii_kinds()) == len(pii.KINDS)
    assert policy.input == DEFAULT.input  # the classifier's rules are untouched
    assert decode(encode(policy)) == policy
    off = apply(policy, [parse_change("pii.*=off")])
    assert off.pii == {} and not off.pii_kinds()
    rows = [r for r in as_table(policy, {}) if r["direction"] == "pii"]
    assert [(r["category"], r["action"]) for r in rows][:2] == [
        ("email", "mask"),
        ("phone", "flag"),
    ]
    assert decode(encode(DEFAULT)).pii == {}  # a stored policy from before PII: all off
    for bad in ("pii.email=mask@0.5", "pii.passport=mask", "pii.email=redact", "input.email=flag"):
        with pytest.raises(ValueError):
            apply(DEFAULT, [parse_change(bad)])


def test_a_teams_terms_match_whole_words_in_any_case_and_are_never_patterns() -> None:
    terms = ("Project Falcon", "ACME", "a.b*")
    blocklist = frozenset({"blocklist"})
    text = "project falcon ships; acme's ACMEcorp stays; a.b* and axb literal"
    found = pii.find(text, blocklist, terms=terms)
    assert [text[f.start : f.end] for f in found] == ["project falcon", "acme", "a.b*"]
    assert pii.mask(text, found, blocklist, {}) == (
        "[REDACTED_1] ships; [REDACTED_2]'s ACMEcorp stays; [REDACTED_3] and axb literal"
    )
    assert pii.find(text, blocklist) == []  # no terms, nothing to find
    policy = apply(DEFAULT, [parse_change("pii.blocklist=block")], terms=terms_of(["x", " X ", ""]))
    assert policy.terms == ("x",) and decode(encode(policy)).terms == ("x",)
    with pytest.raises(ValueError, match="at most"):
        apply(DEFAULT, [], terms=tuple(f"t{i}" for i in range(MAX_TERMS + 1)))


def _audit(sql: Any, team: str) -> list[GuardAudit]:
    with Session(sql) as session:
        return list(session.exec(sqlmodel.select(GuardAudit).where(GuardAudit.team == team)))


def test_the_gateway_masks_before_sending_and_blocks_before_calling(
    gateway: Any, team: Any, sql: Any, upstream: str
) -> None:
    name, key = team()
    specs = ("pii.email=mask", "pii.secret=mask", "pii.credit_card=block", "pii.phone=flag")
    store.write_policy(sql, name, apply(DEFAULT, [parse_change(s) for s in specs]))
    client = gateway.client(key)
    system = {"role": "system", "content": "deployment note: ops@example.com"}
    user = "mail me at jo@example.org, key sk-abcdefghijklmnopqrstuvwx1234 call +1 415 555 2671"
    parts = [{"type": "text", "text": "or jo2@example.org"}]
    messages = [system, {"role": "user", "content": user}, {"role": "user", "content": parts}]
    wait_until(  # the policy cache of the gateway picks the new policy up within its lifetime
        lambda: "[EMAIL_1]" in json.dumps(_sent(client, upstream, messages)), 5, "masking on"
    )
    sent = upstream_stats(upstream)["last_body"]["messages"]
    assert sent[0] == system  # the deployment's own turns are not the user's data
    assert sent[1]["content"] == "mail me at [EMAIL_1], key [SECRET_1] call +1 415 555 2671"
    assert sent[2]["content"][0]["text"] == "or [EMAIL_2]"
    completion = client.completions.create(model=MODEL, prompt="write jo@example.org", max_tokens=2)
    assert completion.choices
    assert upstream_stats(upstream)["last_body"]["prompt"] == "write [EMAIL_1]"

    before = upstream_stats(upstream)["requests"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "card 4111111111111111"}],
            max_tokens=2,
        )
    assert refused.value.code == "content_policy_violation"
    assert "pii/credit_card" in refused.value.message
    assert upstream_stats(upstream)["requests"] == before  # never called

    wait_until(lambda: any(r.action == "block" for r in _audit(sql, name)), 10, "audit rows")
    rows = _audit(sql, name)
    flagged = {c for r in rows if r.action == "flag" for c in r.categories.split(",")}
    assert {"pii/email", "pii/secret", "pii/phone"} <= flagged
    assert all(r.text is None for r in rows)  # never the data itself
    blocked = next(r for r in rows if r.action == "block")
    assert blocked.categories == "pii/credit_card" and json.loads(blocked.scores) == {
        "pii/credit_card": 1.0
    }

    # the team's own terms: masked, then blocked, as the policy says
    policy = store.read_policy(sql, name)
    assert policy is not None
    masking = apply(policy, [parse_change("pii.blocklist=mask")], terms=("Project Falcon",))
    store.write_policy(sql, name, masking)
    codename = [{"role": "user", "content": "status of project FALCON?"}]
    wait_until(lambda: "[REDACTED_1]" in json.dumps(_sent(client, upstream, codename)), 5, "terms")
    store.write_policy(sql, name, apply(masking, [parse_change("pii.blocklist=block")]))

    def refused() -> bool:
        try:
            client.chat.completions.create(model=MODEL, messages=codename, max_tokens=2)
        except openai.BadRequestError as exc:
            return "pii/blocklist" in exc.message
        return False

    wait_until(refused, 5, "the blocklist blocks")


def _sent(client: Any, upstream: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    return upstream_stats(upstream)["last_body"]


def test_phone_numbers_found_from_digit_runs_are_the_matchers_own() -> None:
    """The scan hands libphonenumber only runs of digits (it is slow on long text): on text with
    numbers in many written forms it finds every number the matcher finds reading everything
    (extensions included), and anything more is a number the matcher takes when read alone (read
    whole, it may read neighbouring numbers differently)."""
    import random

    import phonenumbers

    forms = [
        "(415) 555-2671",
        "415.555.2671",
        "+1 415 555 2671",
        "+44 20 7946 0958",
        "+49 30 901820",
        "1-800-555-0199",
        "415 555 2671 ext. 12",
        "order 12345",
        "2024-11-27",
        "4111 1111 1111 1111",
    ]
    rng = random.Random(7)
    words = ["call", "me at", "or", "on", "the", "(note)", "tel:", "phone", "and"]
    for _ in range(30):  # numbers with words between (run together, how to split them is moot)
        text = " ".join(f"{rng.choice(words)} {rng.choice(forms)}" for _ in range(20))
        expected = {(m.start, m.end) for m in phonenumbers.PhoneNumberMatcher(text, "US")}
        found = {(f.start, f.end) for f in pii.find(text, frozenset({"phone"}))}
        assert expected <= found, text
        for a, b in found - expected:
            alone = [m.raw_string for m in phonenumbers.PhoneNumberMatcher(text[a:b], "US")]
            assert alone == [text[a:b]], text


def test_masked_values_come_back_in_the_reply(
    gateway: Any, team: Any, sql: Any, upstream: str
) -> None:
    """The model saw placeholders; the client reads its own values where the reply repeats
    them, whole and streamed (the fake upstream's #echo says the prompt's words back)."""
    name, key = team()
    store.write_policy(sql, name, apply(DEFAULT, [parse_change("pii.email=mask")]))
    client = gateway.client(key)
    ask = [{"role": "user", "content": "#echo write to jo@example.org and ann@example.com #stop"}]
    wait_until(lambda: "[EMAIL_1]" in json.dumps(_sent(client, upstream, ask)), 5, "masking on")
    reply = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=5)
    said = upstream_stats(upstream)["last_body"]["messages"][0]["content"]
    assert said == "#echo write to [EMAIL_1] and [EMAIL_2] #stop"
    assert reply.choices[0].message.content == "write to jo@example.org and ann@example.com "
    stream = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=5, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "write to jo@example.org and ann@example.com "
    legacy = client.completions.create(model=MODEL, prompt=ask[0]["content"], max_tokens=4)
    assert legacy.choices[0].text == "write to jo@example.org and "
