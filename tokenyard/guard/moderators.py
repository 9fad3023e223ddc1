"""Where scores come from: one interface, the shipped classifier behind it, and an OpenAI-compatible
`/v1/moderations` service a deployment may add beside it (TOKENYARD_GUARD_MODERATION_URL).

A Moderator scores texts, one probability per head it knows; `Combined` asks several and keeps, per
head, the highest score (a deployment adding a service can only add strictness).
"""

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

import httpx

from tokenyard.guard.classifier import SafetyClassifier
from tokenyard.guard.taxonomy import HARMFUL, OPENAI_CATEGORIES

log = logging.getLogger("tokenyard.guard")


class ModeratorError(Exception):
    """The moderation service failed or answered something else than its protocol."""


class Moderator(Protocol):
    name: str

    def thresholds(self) -> dict[str, float]:
        """Each head's default decision threshold."""
        ...

    async def scores(self, texts: Sequence[str]) -> list[dict[str, float]]: ...

    async def aclose(self) -> None: ...


class LocalModerator:
    """The trained classifier (guard/classifier.py): in process, sub-millisecond."""

    name = "tokenyard-guard"

    def __init__(self, classifier: SafetyClassifier) -> None:
        self.classifier = classifier
        self.name = f"tokenyard-guard-{classifier.version}"

    def thresholds(self) -> dict[str, float]:
        return self.classifier.thresholds()

    def score_now(self, text: str) -> dict[str, float]:
        return self.classifier.scores(text)

    async def scores(self, texts: Sequence[str]) -> list[dict[str, float]]:
        return [self.classifier.scores(t) for t in texts]

    async def aclose(self) -> None:
        return None


class OpenAIModerator:
    """A service speaking OpenAI's moderation protocol: POST {base}/v1/moderations with
    {"input": [...], "model": ...}, answering results[i].category_scores."""

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        model: str = "omni-moderation-latest",
        timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = (
            base if base.endswith("/moderations") else base.removesuffix("/v1") + "/v1/moderations"
        )
        self.model = model
        self.name = f"openai-compatible:{model}"
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.AsyncClient(timeout=timeout_s, headers=headers)

    def thresholds(self) -> dict[str, float]:
        return dict.fromkeys(OPENAI_CATEGORIES, 0.5)

    async def scores(self, texts: Sequence[str]) -> list[dict[str, float]]:
        try:
            reply = await self.client.post(
                self.url, json={"input": list(texts), "model": self.model}
            )
        except httpx.HTTPError as exc:
            raise ModeratorError(f"moderation service unreachable: {exc}") from None
        if reply.status_code != 200:
            raise ModeratorError(f"moderation service answered {reply.status_code}")
        try:
            results = reply.json()["results"]
            out = [
                {str(k): float(v) for k, v in r["category_scores"].items() if v is not None}
                for r in results
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise ModeratorError(f"moderation service answered off protocol: {exc}") from None
        if len(out) != len(texts):
            raise ModeratorError("moderation service answered a different number of results")
        return out

    async def aclose(self) -> None:
        await self.client.aclose()


class Combined:
    """The local classifier first, then every other service; per head the highest score. A failing
    service is logged and skipped (fail open to the local classifier's scores): a moderation
    outage must not take the platform down."""

    def __init__(self, moderators: Sequence[Moderator]) -> None:
        self.moderators = list(moderators)
        self.name = "+".join(m.name for m in moderators)

    def thresholds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in reversed(self.moderators):  # the first one's thresholds win
            out.update(m.thresholds())
        return out

    async def scores(self, texts: Sequence[str]) -> list[dict[str, float]]:
        results = await asyncio.gather(
            *(m.scores(texts) for m in self.moderators), return_exceptions=True
        )
        merged: list[dict[str, float]] = [{} for _ in texts]
        for i, (moderator, result) in enumerate(zip(self.moderators, results, strict=True)):
            if isinstance(result, BaseException):
                if not isinstance(result, ModeratorError):
                    raise result
                log.warning("%s skipped: %s", moderator.name, result)
                continue
            for into, scores in zip(merged, result, strict=True):
                for head, score in scores.items():
                    if score > into.get(head, -1.0):
                        into[head] = score
                if i > 0 and HARMFUL in into and scores:
                    # a service's own categories open the local classifier's gate too
                    into[HARMFUL] = max(into[HARMFUL], max(scores.values()))
        return merged

    async def aclose(self) -> None:
        for m in self.moderators:
            await m.aclose()
