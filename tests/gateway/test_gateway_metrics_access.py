"""Who may read /metrics: without a metrics key any scraper, but no series names a team; with one,
only its bearer, and then every series. No label takes a value a client chose."""

import uuid
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import MODEL, Gateway, wait_until

CHAT = [{"role": "user", "content": "one two three #chunks=3"}]
METRICS_KEY = "metrics-" + uuid.uuid4().hex


def _scrape(gw: Gateway, authorization: str | None = None) -> httpx.Response:
    headers = {"authorization": authorization} if authorization else {}
    return httpx.get(gw.url + "/metrics", headers=headers)


def _requests_served(text: str) -> float:
    prefix = f'tokenyard_gateway_requests_total{{model="{MODEL}"'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_without_a_metrics_key_no_series_names_a_team(gateway: Gateway, team: Any) -> None:
    name, key = team()
    client = gateway.client(key)
    before = _requests_served(_scrape(gateway).text)
    client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    unknown = "model-" + uuid.uuid4().hex  # a client's arbitrary string: refused, never a label
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=unknown, messages=CHAT, max_tokens=4)
    # the request's series (tokens by team among them) are written together, when it settles
    wait_until(lambda: _requests_served(_scrape(gateway).text) > before, 5, "the request's series")
    answer = _scrape(gateway)
    assert answer.status_code == 200
    assert "# TYPE tokenyard_gateway_tokens_total counter" in answer.text
    assert 'team="' not in answer.text and name not in answer.text
    assert unknown not in answer.text


def test_with_a_metrics_key_only_its_bearer_reads_metrics(start_gateway: Any, team: Any) -> None:
    gw = start_gateway(metrics_key=METRICS_KEY)
    name, key = team()
    gw.client(key).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    for authorization in (None, "Bearer wrong", f"Basic {METRICS_KEY}", f"Bearer {key}"):
        answer = _scrape(gw, authorization)
        assert answer.status_code == 401, authorization
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_metrics_key")
    series = f'tokenyard_gateway_tokens_total{{kind="prompt",model="{MODEL}",team="{name}"}}'
    wait_until(lambda: series in _scrape(gw, f"Bearer {METRICS_KEY}").text, 5, series)
