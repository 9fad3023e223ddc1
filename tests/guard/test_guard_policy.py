"""Team policies (parse, apply, decide) and the sliding-window output watch."""

import asyncio
from typing import Any

import pytest

from tokenyard.core.safety import Verdict
from tokenyard.guard.policy import DEFAULT, Policy, Rule, apply, decode, encode, parse_change
from tokenyard.guard.service import Guard, Screen, Watch, decide


def test_default_policy_is_what_a_platform_accepts() -> None:
    assert DEFAULT.input["jailbreak"].action == "flag"
    assert DEFAULT.input["sexual/minors"].action == "block"
    assert DEFAULT.output["sexual/minors"].action == "block"
    assert all(r.action == "flag" for h, r in DEFAULT.input.items() if h != "sexual/minors")
    assert "jailbreak" not in DEFAULT.output
    assert DEFAULT.store_text is False


def test_changes() -> None:
    p = apply(DEFAULT, [parse_change("input.violence=block@0.8"), parse_change("output.hate=off")])
    assert p.input["violence"] == Rule("block", 0.8)
    assert p.output["hate"].action == "off"
    p = apply(p, [parse_change("*.illicit=block")], store_text=True)
    assert p.input["illicit"].action == p.output["illicit"].action == "block"
    assert p.store_text
    p = apply(p, [parse_change("input.*=off")])
    assert not p.active("input") and p.active("output")
    assert decode(encode(p)) == p
    p = apply(p, [parse_change("*.jailbreak=flag")])  # input only: output has no jailbreak
    assert p.input["jailbreak"].action == "flag" and "jailbreak" not in p.output


@pytest.mark.parametrize(
    "spec",
    [
        "input.violence",
        "input.violence=kill",
        "sideways.hate=flag",
        "output.jailbreak=flag",
        "input.hate=flag@1.5",
        "input.nonsense=flag",
    ],
)
def test_bad_changes(spec: str) -> None:
    with pytest.raises(ValueError):
        apply(DEFAULT, [parse_change(spec)])


def test_decide() -> None:
    rules = {"hate": Rule("flag"), "violence": Rule("block", 0.9), "sexual": Rule("off")}
    defaults = {"hate": 0.5, "violence": 0.5, "sexual": 0.5}
    assert decide(rules, {"hate": 0.1, "violence": 0.8, "sexual": 0.99}, defaults).action == "allow"
    v = decide(rules, {"hate": 0.6, "violence": 0.8}, defaults)
    assert (v.action, v.categories) == ("flag", ("hate",))
    v = decide(rules, {"hate": 0.6, "violence": 0.95}, defaults)
    assert (v.action, v.categories) == ("block", ("hate", "violence"))


class _Moderator:
    """Scores a text 0.9 on violence where it holds "BAD", else 0."""

    name = "fake"

    def thresholds(self) -> dict[str, float]:
        return {"violence": 0.5}

    async def scores(self, texts: Any) -> list[dict[str, float]]:
        return [{"violence": 0.9 if "BAD" in t else 0.0} for t in texts]

    async def aclose(self) -> None:
        pass


class _Audit:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, **row: Any) -> None:
        self.rows.append(row)


def _watch(window: int = 50, stride: int = 10, action: str = "block") -> tuple[Watch, _Audit]:
    guard = Guard.__new__(Guard)
    guard.moderator = _Moderator()
    guard.defaults = {"violence": 0.5}
    guard.window, guard.stride = window, stride
    audit = _Audit()
    guard.audit = audit  # type: ignore[assignment]
    guard._local = None
    guard.score_now = lambda text: {"violence": 0.9 if "BAD" in text else 0.0}  # type: ignore
    policy = Policy(input={}, output={"violence": Rule(action)})  # type: ignore[arg-type]
    return Watch(Screen(guard, policy, "t", "rid", "m")), audit


def test_watch_cuts_at_the_first_bad_window() -> None:
    watch, audit = _watch()
    assert watch.feed("fine text ") is None  # 10 chars: checked, clean
    assert watch.passed == 10
    assert watch.feed("more ") is None  # under the stride: not checked yet
    verdict = watch.feed("BAD stuff")
    assert isinstance(verdict, Verdict) and verdict.blocked
    assert watch.passed == 10  # the clean part
    assert audit.rows[0]["action"] == "block" and audit.rows[0]["direction"] == "output"
    assert audit.rows[0]["text"] is None  # the policy keeps no text


def test_watch_finish_checks_the_tail() -> None:
    watch, _ = _watch(stride=100)
    assert watch.feed("short BAD") is None  # under the stride
    verdict = watch.finish()
    assert verdict is not None and verdict.blocked


def test_watch_window_slides() -> None:
    watch, _ = _watch(window=20, stride=5)
    assert watch.feed("BAD") is None  # under the stride
    assert watch.feed("xx") is not None  # 5 chars, "BAD" in the window
    watch, _ = _watch(window=20, stride=30)
    watch.feed("BAD" + "x" * 40)  # BAD left the 20-char window before the check
    assert watch.finish() is None


def test_flags_are_recorded_once_per_reply() -> None:
    watch, audit = _watch(action="flag")
    for _ in range(5):
        assert watch.feed("BAD BAD BAD") is None
    assert watch.finish() is None
    assert len(audit.rows) == 1 and audit.rows[0]["action"] == "flag"


def test_input_check_off_costs_nothing() -> None:
    guard, _ = _watch()[0].guard, None
    screen = Screen(guard, Policy(input={}, output={}), "t", "rid", "m")  # type: ignore[arg-type]
    assert asyncio.run(screen.check_input("BAD")).action == "allow"
    assert screen.watch_output() is None
