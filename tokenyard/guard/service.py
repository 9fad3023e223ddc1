"""The safety layer as the gateway's walk sees it (core.safety.Safety): per request, the team's
policy, the input verdict, and a sliding-window watch over the reply; every flag and block becomes
an audit row and a counter.

Built once at startup (`build`): the classifier is loaded there, never on the request path, and
the gateway serves nothing until startup is done.
"""

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import Engine

from tokenyard.core.safety import ALLOW, Verdict
from tokenyard.core.settings import Settings
from tokenyard.guard import metrics, pii
from tokenyard.guard.classifier import DEFAULT_ARTIFACT, SafetyClassifier
from tokenyard.guard.moderators import Combined, LocalModerator, Moderator, OpenAIModerator
from tokenyard.guard.policy import Policy, Rule
from tokenyard.guard.store import AuditLog, PolicyCache
from tokenyard.guard.taxonomy import CATEGORIES, HARMFUL

# a prompt's texts scanned for personal data on the event loop up to this many characters (about
# 1 ms; bench/RESULTS.md), longer ones in a thread: the loop serves every other request meanwhile
PII_INLINE_CHARS = 4_000


def decide(rules: dict[str, Rule], scores: dict[str, float], defaults: dict[str, float]) -> Verdict:
    """The categories over the team's thresholds. A category counts only where the classifier's
    harmful head (any category at all) is over its own threshold too: one gate, so the false
    positives of a dozen heads do not add up."""
    over: list[str] = []
    block = False
    harmful = scores.get(HARMFUL)
    gate = harmful is None or harmful >= defaults.get(HARMFUL, 0.5)
    for head, rule in rules.items():
        if rule.action == "off" or (head in CATEGORIES and not gate):
            continue
        threshold = rule.threshold if rule.threshold is not None else defaults.get(head, 0.5)
        if scores.get(head, 0.0) >= threshold:
            over.append(head)
            block = block or rule.action == "block"
    if not over:
        return Verdict("allow", (), scores)
    return Verdict("block" if block else "flag", tuple(over), scores)


class Guard:
    def __init__(
        self,
        moderator: Moderator,
        policies: PolicyCache,
        audit: AuditLog,
        window: int = 1000,
        stride: int = 200,
        pii_region: str | None = "US",
    ) -> None:
        self.moderator = moderator
        self.pii_region = pii_region  # how phone numbers without a country code are read
        self.policies = policies
        self.audit = audit
        self.window = window
        self.stride = stride
        self.defaults = moderator.thresholds()
        # metric children looked up once (a labels() call per request costs microseconds)
        self._seconds = {d: metrics.CHECK_SECONDS.labels(d) for d in ("input", "output")}
        self._allowed: dict[tuple[str, str], Any] = {}
        # the local classifier scores in line (sub-millisecond, no await); a service is awaited
        self._local = moderator if isinstance(moderator, LocalModerator) else None

    async def screen(
        self, team: str, request_id: str, model: str, end_user: str | None = None
    ) -> "Screen | None":
        policy = await self.policies.get(team)
        if not (policy.active("input") or policy.active("output") or policy.pii):
            return None  # the team checks nothing: nothing is scored
        return Screen(self, policy, team, request_id, model, end_user)

    async def score(self, text: str, direction: str) -> dict[str, float]:
        began = time.perf_counter()
        if self._local is not None:
            scores = self._local.score_now(text)
        else:
            scores = (await self.moderator.scores([text]))[0]
        self._seconds[direction].observe(time.perf_counter() - began)
        return scores

    def score_now(self, text: str) -> dict[str, float] | None:
        """In line, for the output watch; None where scores need an await (a service)."""
        if self._local is None:
            return None
        began = time.perf_counter()
        scores = self._local.score_now(text)
        self._seconds["output"].observe(time.perf_counter() - began)
        return scores

    def outcome(self, screen: "Screen", direction: str, verdict: Verdict, text: str | None) -> None:
        """Count it; a flag or block is also an audit row."""
        if verdict.action == "allow":
            key = (screen.team, direction)
            child = self._allowed.get(key)
            if child is None:
                if len(self._allowed) > 10_000:
                    self._allowed.clear()
                child = self._allowed[key] = metrics.OUTCOMES.labels(
                    screen.team, "none", direction, "allow"
                )
            child.inc()
            return
        for category in verdict.categories:
            metrics.OUTCOMES.labels(screen.team, category, direction, verdict.action).inc()
        self.audit.record(
            request_id=screen.request_id,
            team=screen.team,
            direction=direction,
            action=verdict.action,
            categories=verdict.categories,
            scores=dict(verdict.scores),
            model=screen.model,
            end_user=screen.end_user,
            text=text if screen.policy.store_text else None,
        )

    async def aclose(self) -> None:
        await self.audit.stop()
        await self.moderator.aclose()


class Screen:
    """One request's screening (core.safety.RequestScreen)."""

    def __init__(
        self,
        guard: Guard,
        policy: Policy,
        team: str,
        request_id: str,
        model: str,
        end_user: str | None = None,
    ):
        self.guard = guard
        self.policy = policy
        self.team = team
        self.request_id = request_id
        self.model = model
        self.end_user = end_user  # the request's `safety_identifier` or `user`, for the audit
        self.labels: dict[tuple[str, str], str] = {}  # (kind, value) → its placeholder

    @property
    def masked(self) -> dict[str, str]:
        return {name: value for (_, value), name in self.labels.items()}

    async def scrub(self, texts: list[str]) -> tuple[list[str], Verdict]:
        kinds = self.policy.pii_kinds()
        if not kinds:
            return texts, ALLOW
        region, terms = self.guard.pii_region, self.policy.terms
        if sum(map(len, texts)) < PII_INLINE_CHARS:
            found = [pii.find(text, kinds, region, terms) for text in texts]
        else:
            found = await asyncio.to_thread(
                lambda: [pii.find(t, kinds, region, terms) for t in texts]
            )
        seen = sorted({f.kind for spans in found for f in spans})
        if not seen:
            return texts, ALLOW
        action = self.policy.pii
        blocked = [k for k in seen if action[k] == "block"]
        masked = self.policy.pii_kinds("mask")
        # an audit row per request: blocked kinds if any block, else every kind flagged or masked
        named = blocked or seen
        # the audit row's "scores": how many distinct values of each kind (a Responses request
        # to OpenAI is scrubbed in both its forms, chat's and OpenAI's own, so values repeat)
        pairs = zip(texts, found, strict=True)
        values = {(f.kind, t[f.start : f.end]) for t, spans in pairs for f in spans}
        counts = Counter(kind for kind, _ in values)
        verdict = Verdict(
            "block" if blocked else "flag",
            tuple(pii.PREFIX + k for k in named),
            {pii.PREFIX + k: float(counts[k]) for k in named},
        )
        self.guard.outcome(self, "input", verdict, None)  # never the text: it holds the data
        if blocked:
            return texts, verdict
        pairs = zip(texts, found, strict=True)
        return [pii.mask(t, spans, masked, self.labels) for t, spans in pairs], verdict

    async def check_input(self, text: str) -> Verdict:
        if not self.policy.active("input"):
            return ALLOW
        scores = await self.guard.score(text, "input")
        verdict = decide(self.policy.input, scores, self.guard.defaults)
        self.guard.outcome(self, "input", verdict, text)
        return verdict

    def watch_output(self) -> "Watch | None":
        if not self.policy.active("output") or self.guard._local is None:
            return None  # a remote service is not asked per window (docs/guard.md)
        return Watch(self)


class Watch:
    """A reply read as it streams: every `stride` new characters the last `window` characters are
    scored; the first window over a blocking threshold ends the reply. Flags are recorded once per
    reply (the first window that raised them)."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen
        self.guard = screen.guard
        self.tail = ""  # the last `window` characters read
        self.total = 0  # characters read
        self.checked = 0  # characters read at the last check
        self._passed = 0  # characters checked and clean (not blocked) so far
        self.flagged = False
        self.result: Verdict = ALLOW

    @property
    def passed(self) -> int:
        return self._passed

    def feed(self, text: str) -> Verdict | None:
        if not text:
            return None
        self.tail = (self.tail + text)[-self.guard.window :]
        self.total += len(text)
        if self.total - self.checked < self.guard.stride:
            return None
        return self._check()

    def finish(self) -> Verdict | None:
        if self.total == self.checked:
            return None
        return self._check()

    def _check(self) -> Verdict | None:
        self.checked = self.total
        scores = self.guard.score_now(self.tail)
        if scores is None:
            return None
        verdict = decide(self.screen.policy.output, scores, self.guard.defaults)
        if verdict.action == "allow":
            self._passed = self.total
            return None
        if verdict.blocked:
            self.result = verdict
            self.guard.outcome(self.screen, "output", verdict, self.tail)
            return verdict
        self._passed = self.total
        if not self.flagged:
            self.flagged = True
            self.result = verdict
            self.guard.outcome(self.screen, "output", verdict, self.tail)
        return None


def build_moderator(settings: Settings) -> tuple[Moderator, SafetyClassifier]:
    classifier = SafetyClassifier.load(Path(settings.guard_artifact or DEFAULT_ARTIFACT))
    local = LocalModerator(classifier)
    if not settings.guard_moderation_url:
        return local, classifier
    remote = OpenAIModerator(
        settings.guard_moderation_url,
        settings.guard_moderation_key.get_secret_value(),
        settings.guard_moderation_model,
    )
    return Combined([local, remote]), classifier


def build(settings: Settings, sql: Engine, redis: aioredis.Redis | None) -> Guard:
    """Load the classifier (blocking: call off the event loop) and wire the stores."""
    moderator, _ = build_moderator(settings)
    return Guard(
        moderator,
        PolicyCache(sql, redis, settings.gateway_key_cache_s),
        AuditLog(sql),
        window=settings.guard_window_chars,
        stride=settings.guard_stride_chars,
        pii_region=settings.guard_pii_region or None,
    )


def describe(guard: Guard) -> dict[str, Any]:
    return {"moderator": guard.moderator.name, "thresholds": guard.defaults}
