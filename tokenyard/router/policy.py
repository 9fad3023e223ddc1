"""The routing policy: which models may serve a request, in the order to try them.

An explicit model is tried first, then its fallback chain. `model="auto"` scores the prompt with the
complexity classifier: below the team's threshold it goes to the cheapest model, at or above it to
the cheapest model of the catalog's strong capability, each followed by its fallbacks. With a
quality bar (the team's, or the catalog's default) it goes instead to the cheapest model whose
predicted quality on the prompt clears the bar (router/quality.py). Every candidate must be
allowed for the team and serve the request's tier; the gateway then skips the ones that are down
(circuit open, not ready) or saturated, and falls back on a failure before the first byte.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tokenyard.backends.fields import Ask, Refusal, ask_of, refusal
from tokenyard.core.messages import content_text
from tokenyard.router.catalog import Catalog, Kind, ModelEntry
from tokenyard.router.features import encode_features
from tokenyard.router.quality import QualityCurve, cheapest_clearing
from tokenyard.router.scorer import RouteScore

AUTO = "auto"
# what a model of each kind serves, as a refusal names it
ENDPOINTS = {
    "chat": "chat and completions",
    "embedding": "embeddings",
    "rerank": "reranking",
    "image": "image generation",
    "transcription": "transcriptions and translations",
    "speech": "speech",
}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    asked: str
    candidates: tuple[str, ...]  # in the order to try; the first is the policy's choice
    score: float | None = None  # the classifier's, for model="auto"
    escalated: bool = False  # auto sent it to the strong class
    confidence: float | None = None  # how sure the classifier is (0: far from its training data)
    features: str | None = None  # auto: the router's view of the prompt, kept for feedback
    predicted_quality: float | None = None  # auto under a quality bar: the chosen model's, 0-1
    # the first candidate's context fallbacks (with theirs), for a request its window cannot hold
    wider: tuple[str, ...] = ()

    def widened(self) -> "Route":
        """The route of a request found too long for the first candidate's context window."""
        return replace(self, candidates=self.wider, wider=())


class TeamRouting(Protocol):
    """What a team's policy says about routing (tenancy.policy.TeamPolicy has these fields)."""

    @property
    def models(self) -> tuple[str, ...]: ...  # allowed models; empty: all

    @property
    def auto_threshold(self) -> float | None: ...

    @property
    def strong_share(self) -> float | None: ...

    @property
    def auto_quality(self) -> float | None: ...

    @property
    def deployment_tags(self) -> frozenset[str]: ...  # every deployment serving it carries these


class NoRoute(Exception):
    """No model in the catalog can serve the request: unknown, not allowed, or not for this tier."""


class Unsupported(Exception):
    """The request asks for what the model named (or, for auto, every model) cannot do."""

    def __init__(self, found: Refusal) -> None:
        super().__init__(found.message)
        self.refusal = found


class Classifier(Protocol):
    """What routing reads of a complexity classifier (router/classifier.py's as shipped)."""

    @property
    def version(self) -> str: ...

    @property
    def quality_curves(self) -> dict[str, QualityCurve]: ...

    def route_score(self, prompt: str) -> RouteScore: ...

    def threshold_for_strong_share(self, share: float) -> float: ...


class Scorer:
    """The complexity classifier, loaded on first use so processes that never route "auto" (and
    the CLI) do not pay for loading it; thresholds from shares are cached."""

    def __init__(self, load: Callable[[], Classifier]) -> None:
        self._load = load
        self._classifier: Classifier | None = None
        self._thresholds: dict[float, float] = {}

    @property
    def classifier(self) -> Classifier:
        if self._classifier is None:
            self._classifier = self._load()
        return self._classifier

    def route_score(self, prompt: str) -> RouteScore:
        return self.classifier.route_score(prompt)

    @property
    def quality_curves(self) -> dict[str, QualityCurve]:
        return self.classifier.quality_curves

    def features(self, prompt: str, decision: str, score: RouteScore) -> str:
        version = self.classifier.version
        return encode_features(version, decision, score.projected, len(prompt), score.code)

    def threshold(self, share: float) -> float:
        if share not in self._thresholds:
            self._thresholds[share] = self.classifier.threshold_for_strong_share(share)
        return self._thresholds[share]


def prompt_text(body: dict[str, Any]) -> str:
    """What the classifier scores: the last user turn (chat), or the prompt (completions)."""
    messages = body.get("messages")
    if messages is None:
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    user = [m for m in messages if m.get("role") == "user"]
    return content_text(user[-1].get("content")) if user else ""


def prefix_text(body: dict[str, Any]) -> str:
    """What requests that share a cached prompt prefix share: the first message (often the system
    prompt), or the prompt. Engine replicas are picked by it (prefix affinity). A client's
    `prompt_cache_key` names the group outright, as OpenAI routes by it."""
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key
    messages = body.get("messages")
    if messages:
        return content_text(messages[0].get("content"))
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


class Router:
    def __init__(self, catalog: Catalog, scorer: Scorer) -> None:
        self.catalog = catalog
        self.scorer = scorer
        self._unknown: set[str] = set()  # quality references warned about

    def _eligible(
        self,
        entry: ModelEntry,
        team: TeamRouting,
        tier: str,
        kind: Kind,
        ask: Ask | None = None,
        prompt_tokens: int = 0,
    ) -> bool:
        """Allowed, of the kind, serving the tier; with an `ask`, also able to honour every field
        it sets and with room for the prompt."""
        return (
            (not team.models or entry.id in team.models)
            and entry.serves_tags(team.deployment_tags)
            and tier in entry.tiers
            and entry.serves(kind)
            and (ask is None or refusal(ask, entry.id, entry.wire, entry.supports) is None)
            and not (entry.max_context and prompt_tokens >= entry.max_context)
        )

    def route(
        self,
        model: str,
        body: dict[str, Any],
        team: TeamRouting,
        tier: str,
        kind: Kind = "chat",
        prompt_tokens: int = 0,
    ) -> Route:
        """`kind`: what the endpoint serves; a model of the other kind is not a route (OpenAI
        answers an embedding model on chat completions with a 404 too). Fallbacks and auto's
        candidates are only models that honour every field the request sets (Unsupported names
        the first one a named model cannot) and whose context fits `prompt_tokens` (an estimate;
        0: unknown; a named model's own window is checked by the gateway)."""
        ask = ask_of(body) if kind == "chat" else None

        def fits(entry: ModelEntry) -> bool:  # a fallback of either kind can take the request
            return self._eligible(entry, team, tier, kind, ask, prompt_tokens)

        if model != AUTO:
            entry = self.catalog.get(model)
            if entry is None or (team.models and model not in team.models):
                raise NoRoute(f"the model {model!r} does not exist or you do not have access to it")
            if not entry.serves(kind):
                serves = ENDPOINTS[entry.kind] + (" and reranking" if entry.rerank else "")
                raise NoRoute(f"the model {model!r} serves {serves} only")
            if tier not in entry.tiers:
                raise NoRoute(f"the model {model!r} does not serve the {tier} tier")
            if not entry.serves_tags(team.deployment_tags):
                tags = ", ".join(sorted(team.deployment_tags))
                raise NoRoute(f"the model {model!r} has no deployment tagged {tags} for your team")
            found = refusal(ask, entry.id, entry.wire, entry.supports) if ask else None
            if found:
                raise Unsupported(found)
            chain = self._chain(model, fits)
            return Route(model, chain, wider=self._wider(chain, fits))
        able = self._able(team, tier, kind, ask, prompt_tokens)
        prompt = prompt_text(body)
        scored = self.scorer.route_score(prompt)
        pool, escalated, predicted = self._choose(able, scored.score, team)
        candidates = list(self._chain(pool[0].id, fits))
        # after the chosen model's own fallbacks, the rest of its class by price
        candidates += [m.id for m in pool if m.id not in candidates]
        features = self.scorer.features(prompt, "strong" if escalated else "weak", scored)
        return Route(
            AUTO,
            tuple(candidates),
            scored.score,
            escalated,
            scored.confidence,
            features,
            predicted,
            self._wider(candidates, fits),
        )

    def _able(
        self, team: TeamRouting, tier: str, kind: Kind, ask: Ask | None, prompt_tokens: int
    ) -> list[ModelEntry]:
        """Auto's candidates in price order: configured, allowed, able to serve the request."""
        usable = [
            m
            for m in self.catalog.by_price()
            if m.configured and self._eligible(m, team, tier, kind)
        ]
        if not usable:
            raise NoRoute(f"no model this team may use can serve the {tier} tier")
        able = [m for m in usable if self._eligible(m, team, tier, kind, ask, prompt_tokens)]
        if not able:  # the cheapest model says what it cannot do
            first = usable[0]
            found = refusal(ask, first.id, first.wire, first.supports) if ask else None
            if not found:
                raise NoRoute(f"no model this team may use fits a prompt of {prompt_tokens} tokens")
            raise Unsupported(found)
        return able

    def _choose(
        self, able: list[ModelEntry], score: float, team: TeamRouting
    ) -> tuple[list[ModelEntry], bool, float | None]:
        """The chosen model first, then the rest of its class by price; whether that is the
        strong class; the chosen model's predicted quality (with a quality bar)."""
        bar = self._quality_bar(team)
        picked = self._by_quality(able, score, bar) if bar is not None else None
        if picked is not None:
            first, predicted = picked
            rest = [m for m in able if m is not first and m.capability >= first.capability]
            return (
                [first, *rest],
                first.capability >= self.catalog.auto.strong_capability,
                predicted,
            )
        escalated = score >= self._threshold(team)
        need = self.catalog.auto.strong_capability if escalated else 0
        # a team with no model of the strong class gets its most capable ones instead
        need = min(need, max(m.capability for m in able))
        return [m for m in able if m.capability >= need], escalated, None

    def _quality_bar(self, team: TeamRouting) -> float | None:
        """The team's bar; a team that set a threshold or a share routes by it; else the
        catalog's bar (None: threshold routing)."""
        if team.auto_quality is not None:
            return team.auto_quality
        if team.auto_threshold is not None or team.strong_share is not None:
            return None
        return self.catalog.auto.quality_bar

    def _by_quality(
        self, able: list[ModelEntry], score: float, bar: float
    ) -> tuple[ModelEntry, float] | None:
        """The cheapest of `able` (in price order) whose predicted quality clears `bar`, or the
        one predicted best; None when no model has a curve (threshold routing then). A model's
        own curve (fitted on the platform's ratings of it) wins over its reference's."""
        curves = self.scorer.quality_curves
        rated = []
        for m in able:
            curve = curves.get(m.id) or curves.get(m.quality_reference)
            if curve is not None:
                rated.append((m, float(curve.predict(score))))
            elif m.quality_reference and m.quality_reference not in self._unknown:
                self._unknown.add(m.quality_reference)
                log.warning(
                    "%s: quality_reference %r is not a model of the router's artifact",
                    m.id,
                    m.quality_reference,
                )
        if not rated:
            return None
        return rated[cheapest_clearing([q for _, q in rated], bar)]

    def _chain(self, model: str, fits: Callable[[ModelEntry], bool]) -> tuple[str, ...]:
        """The model, then those of its fallbacks (transitively) that can take the request."""
        entries = (self.catalog.models[m] for m in self.catalog.chain(model))
        return tuple(m.id for m in entries if m.id == model or fits(m))

    def _wider(
        self, candidates: Sequence[str], fits: Callable[[ModelEntry], bool]
    ) -> tuple[str, ...]:
        """The first candidate's context fallbacks, each followed by its own fallbacks, that can
        take the request (a model may be a fallback of both kinds: widened, the route is these
        alone)."""
        first, wider = candidates[0], []
        for head in self.catalog.models[first].context_fallbacks:
            for model in self.catalog.chain(head):
                if model not in wider and model != first and fits(self.catalog.models[model]):
                    wider.append(model)
        return tuple(wider)

    def _threshold(self, team: TeamRouting) -> float:
        if team.auto_threshold is not None:
            return team.auto_threshold
        share = team.strong_share
        return self.scorer.threshold(self.catalog.auto.strong_share if share is None else share)
