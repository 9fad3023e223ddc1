"""Reusable prompts: a team's templates through `/v1/prompts` (versions, team-scoped), and the
Responses API's `prompt` through the official SDK: the template filled with the variables and put
before the input, the version pinned or the latest, bad variables refused naming them."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import Gateway, upstream_stats
from tests.openai_spec import problems
from tokenyard.tenancy import keys, teams

TEMPLATE = [
    {"role": "developer", "content": "Answer about {{city}} in a {{ tone }} tone."},
    {"role": "user", "content": "What is {{city}} known for?"},
    {"role": "assistant", "content": "Its food."},
]


@pytest.fixture
def key(team: Any) -> str:
    return team()[1]


def _api(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.url + "/v1", headers={"authorization": f"Bearer {key}"})


def test_a_teams_prompts_are_versioned_and_its_own(
    capabilities_gw: Gateway, key: str, sql: Any
) -> None:
    with _api(capabilities_gw, key) as api:
        made = api.post("/prompts", json={"messages": TEMPLATE, "description": "city guide"})
        assert made.status_code == 200, made.text
        prompt = made.json()
        assert prompt["id"].startswith("pmpt_") and prompt["version"] == "1"
        assert prompt["variables"] == ["city", "tone"] and prompt["description"] == "city guide"
        pid = prompt["id"]
        second = api.post(f"/prompts/{pid}", json={"messages": TEMPLATE[:1]}).json()
        assert second["version"] == "2" and second["variables"] == ["city", "tone"]
        assert api.get(f"/prompts/{pid}").json()["version"] == "2"  # the latest
        assert api.get(f"/prompts/{pid}", params={"version": "1"}).json()["messages"] == TEMPLATE
        versions = api.get(f"/prompts/{pid}/versions").json()["data"]
        assert [v["version"] for v in versions] == ["1", "2"]
        assert [p["id"] for p in api.get("/prompts").json()["data"]] == [pid]
        for bad, param in (
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
            ({"messages": [{"role": "user"}]}, "messages"),
        ):
            refused = api.post("/prompts", json=bad)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, bad
        # another team sees none of it, as if it did not exist
        other = "prompts-" + uuid.uuid4().hex[:8]
        teams.create_team(sql, other)
        with _api(capabilities_gw, keys.create_key(sql, other).key) as stranger:
            assert stranger.get(f"/prompts/{pid}").status_code == 404
            assert stranger.post(f"/prompts/{pid}", json={"messages": TEMPLATE}).status_code == 404
            assert stranger.delete(f"/prompts/{pid}").status_code == 404
            assert stranger.get("/prompts").json()["data"] == []
        for missing in ("9", "99999999999999999999", "x"):
            assert api.get(f"/prompts/{pid}", params={"version": missing}).status_code == 404
        assert api.delete(f"/prompts/{pid}").json() == {
            "id": pid,
            "object": "prompt.deleted",
            "deleted": True,
        }
        assert api.get(f"/prompts/{pid}").status_code == 404


def test_a_response_fills_the_prompt_before_its_input(
    capabilities_gw: Gateway, key: str, upstream: str
) -> None:
    with _api(capabilities_gw, key) as api:
        pid = api.post("/prompts", json={"messages": TEMPLATE}).json()["id"]
        api.post(f"/prompts/{pid}", json={"messages": [{"role": "developer", "content": "v2"}]})
    client = capabilities_gw.client(key)
    variables = {"city": "Lyon", "tone": {"type": "input_text", "text": "warm"}}
    response = client.responses.create(
        model="fake",
        prompt={"id": pid, "version": "1", "variables": variables},
        input="And the wine? #stop",
    )
    assert response.status == "completed"
    sent = upstream_stats(upstream)["last_body"]["messages"]
    assert sent == [
        {"role": "developer", "content": "Answer about Lyon in a warm tone."},
        {"role": "user", "content": "What is Lyon known for?"},
        {"role": "assistant", "content": "Its food."},
        {"role": "user", "content": "And the wine? #stop"},
    ]
    assert response.prompt is not None and response.prompt.id == pid
    assert response.prompt.version == "1"
    stored = client.responses.with_raw_response.retrieve(response.id).http_response.json()
    assert not problems("Response", stored)
    # the prompt is not part of the stored context: the input items are the input alone
    assert len(client.responses.input_items.list(response.id).data) == 1
    # no version: the latest
    latest = client.responses.create(model="fake", prompt={"id": pid}, input="hi #stop")
    assert latest.prompt is not None and latest.prompt.version == "2"
    assert upstream_stats(upstream)["last_body"]["messages"][0]["content"] == "v2"


@pytest.mark.parametrize(
    ("prompt", "status", "param"),
    [
        ({"variables": {"city": "Lyon"}}, 400, "prompt.variables"),  # tone missing
        ({"variables": {"city": "Lyon", "tone": "dry", "mood": "x"}}, 400, "prompt.variables"),
        ({"variables": {"city": "Lyon", "tone": {"type": "input_image"}}}, 400, None),
        ({"variables": {"city": "Lyon", "tone": "dry"}, "version": "7"}, 404, "prompt"),
        ({"id": "pmpt_nope"}, 404, "prompt"),
        ({"id": 5}, 400, "prompt.id"),
        ({"variables": ["city"]}, 400, "prompt.variables"),
    ],
)
def test_a_prompt_that_cannot_be_filled_is_refused_naming_why(
    capabilities_gw: Gateway, key: str, prompt: dict[str, Any], status: int, param: str | None
) -> None:
    with _api(capabilities_gw, key) as api:
        pid = api.post("/prompts", json={"messages": TEMPLATE}).json()["id"]
    client = capabilities_gw.client(key)
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model="fake", prompt={"id": pid, **prompt}, input="x")
    assert refused.value.status_code == status
    expected = param or "prompt.variables.tone"
    assert refused.value.body["param"] == expected  # type: ignore[index]


def test_versions_saved_at_once_each_get_their_own_number(
    capabilities_gw: Gateway, key: str
) -> None:
    with _api(capabilities_gw, key) as api:
        pid = api.post("/prompts", json={"messages": TEMPLATE}).json()["id"]

        def save(i: int) -> httpx.Response:
            with _api(capabilities_gw, key) as own:
                body = {"messages": [{"role": "developer", "content": f"v{i}"}]}
                return own.post(f"/prompts/{pid}", json=body)

        with ThreadPoolExecutor(8) as pool:
            saved = list(pool.map(save, range(8)))
        assert [r.status_code for r in saved] == [200] * 8
        assert sorted(int(r.json()["version"]) for r in saved) == list(range(2, 10))
