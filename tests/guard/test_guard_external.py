"""The pluggable moderation backend: an OpenAI-compatible /v1/moderations service, checked against
a local server that speaks the protocol (a tokenyard gateway: its /v1/moderations is OpenAI's), and
wired into a second gateway with TOKENYARD_GUARD_MODERATION_URL."""

import asyncio
import socket
from typing import Any

import httpx
import pytest

from tests.guard.conftest import Texts
from tokenyard.guard.classifier import SafetyClassifier
from tokenyard.guard.moderators import Combined, LocalModerator, ModeratorError, OpenAIModerator
from tokenyard.guard.taxonomy import CATEGORIES, HARMFUL


def _scores(moderator: Any, texts: list[str]) -> list[dict[str, float]]:
    async def run() -> list[dict[str, float]]:
        try:
            return await moderator.scores(texts)
        finally:
            await moderator.aclose()

    return asyncio.run(run())


def test_remote_scores_are_the_servers(
    gateway: Any, team: Any, classifier: SafetyClassifier, texts: Texts
) -> None:
    _, key = team()
    remote = OpenAIModerator(gateway.url, key)
    got = _scores(remote, [texts.benign, texts.harmful])
    for text, scores in zip([texts.benign, texts.harmful], got, strict=True):
        local = classifier.scores(text)
        for category in CATEGORIES:  # the answer's scores: at most the harmful head's
            expected = min(local[category], local[HARMFUL])
            assert scores[category] == pytest.approx(expected, abs=1e-5)
    # the whole base URL, with or without /v1, or the endpoint itself
    for base in (gateway.url + "/v1", gateway.url + "/v1/moderations"):
        assert _scores(OpenAIModerator(base, key), [texts.benign])[0].keys() == got[0].keys()


def test_combined_takes_the_higher_score_and_survives_an_outage(
    gateway: Any, team: Any, classifier: SafetyClassifier, texts: Texts
) -> None:
    _, key = team()
    local = LocalModerator(classifier)
    both = _scores(Combined([local, OpenAIModerator(gateway.url, key)]), [texts.harmful])[0]
    assert both["jailbreak"] == pytest.approx(classifier.scores(texts.harmful)["jailbreak"])
    assert "self-harm/intent" in both  # the service's own categories join

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    alone = _scores(Combined([local, OpenAIModerator(dead, timeout_s=1)]), [texts.harmful])[0]
    assert alone == pytest.approx(classifier.scores(texts.harmful))


def test_off_protocol_answers_are_errors(gateway: Any, team: Any) -> None:
    _, key = team()
    with pytest.raises(ModeratorError):  # a 401: a wrong key
        _scores(OpenAIModerator(gateway.url, "ty-wrong"), ["hello"])
    with pytest.raises(ModeratorError):  # no such endpoint
        _scores(OpenAIModerator(gateway.url + "/nothing/moderations", key), ["hello"])

    def wrong(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"results": [{"no": "scores"}]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(wrong))
    with pytest.raises(ModeratorError):
        _scores(OpenAIModerator("http://x", client=client), ["hello"])


def test_a_gateway_with_a_moderation_service(
    gateway: Any, start_gateway: Any, team: Any, texts: Texts
) -> None:
    _, key = team()
    chained = start_gateway(guard_moderation_url=gateway.url, guard_moderation_key=key)
    reply = httpx.post(
        chained.url + "/v1/moderations",
        json={"input": texts.harmful},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert "openai-compatible" in body["model"]
    assert body["results"][0]["flagged"]
