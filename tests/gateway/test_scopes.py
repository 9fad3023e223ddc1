"""Restricted keys: a team's or a key's `scopes` name the kinds of endpoint its requests may call
(OpenAI's restricted API keys; LiteLLM's allowed routes). Proven through the official SDKs against
a running gateway: each kind refused outside the scopes with 403 `insufficient_scope`, before any
upstream call; the model listing open to every key; a key narrowing its team's; a change applying
within the key cache's time."""

import uuid
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.gateway.conftest import MODEL, Gateway, upstream_stats, wait_until
from tokenyard.app import create_app
from tokenyard.gateway.scopes import CLOSED, scope_of
from tokenyard.tenancy import keys, teams
from tokenyard.tenancy.limits import SCOPES, problem, scopes_text

ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi #chunks=1 #stop"}]}


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/v1/chat/completions", "completions"),
        ("/v1/chat/completions/chatcmpl-1/messages", "completions"),
        ("/v1/completions", "completions"),
        ("/v1/responses/resp_1/input_items", "completions"),
        ("/v1/conversations/conv_1/items", "completions"),
        ("/v1/messages", "completions"),
        ("/v1/messages/count_tokens", "completions"),
        ("/v1/messages/batches/msgbatch_1/results", "batch"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/rerank", "embeddings"),
        ("/v2/rerank", "embeddings"),
        ("/v1/moderations", "moderations"),
        ("/v1/files/file-1/content", "batch"),
        ("/v1/batches", "batch"),
        ("/v1/batch", "batch"),
        ("/v1/usage/requests", "usage"),
        ("/v1/feedback", "feedback"),
        ("/v1beta/models/fake:generateContent", "completions"),
        ("/v1beta/models/fake:streamGenerateContent", "completions"),
        ("/v1beta/models/fake:countTokens", "completions"),
        ("/v1beta/models/fake:embedContent", "embeddings"),
        ("/v1beta/models/fake:batchEmbedContents", "embeddings"),
        ("/v1beta/models/fake", None),
        ("/v1/models", None),
        ("/v1/models/fake", None),
        ("/v1/batchesx", CLOSED),  # a prefix only counts whole
        ("/v1/somethingnew", CLOSED),
    ],
)
def test_each_path_is_its_kind(path: str, kind: str | None) -> None:
    assert scope_of(path) == kind


def test_every_team_route_of_the_app_has_a_kind() -> None:
    """A route a team's key calls that nobody gave a kind would be closed to restricted keys:
    every one has one (the admin API takes admin keys, not team keys)."""
    for route in create_app().routes:
        path = route.path
        if path.startswith(("/v1/", "/v1beta/")) and not path.startswith("/v1/admin"):
            assert scope_of(path.replace(":str}", "}")) != CLOSED, path


def test_scopes_are_checked_and_kept_in_one_form() -> None:
    assert scopes_text(" embeddings , completions,embeddings") == "completions,embeddings"
    assert scopes_text(["batch"]) == "batch" and scopes_text("") is None
    assert problem("scopes", "completions, chat") is not None
    assert "chat" in (problem("scopes", ["chat"]) or "")
    assert problem("scopes", 3) is not None and problem("scopes", ",".join(SCOPES)) is None


def _refused(call: Any) -> str:
    with pytest.raises(openai.PermissionDeniedError) as refused:
        call()
    assert refused.value.status_code == 403
    return refused.value.code or ""


def test_a_key_restricted_to_some_kinds_calls_only_those(
    gateway: Gateway, sql: Any, upstream: str
) -> None:
    name = "scoped-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name)
    usage_only = keys.create_key(sql, name, limits={"scopes": "usage"}).key
    chat_only = keys.create_key(sql, name, limits={"scopes": ["completions"]}).key
    client, chat = gateway.client(usage_only), gateway.client(chat_only)
    before = upstream_stats(upstream)["completed"]
    assert _refused(lambda: client.chat.completions.create(**ASK)) == "insufficient_scope"
    assert _refused(lambda: client.responses.create(model=MODEL, input="hi")) == (
        "insufficient_scope"
    )
    assert upstream_stats(upstream)["completed"] == before  # refused before any upstream call
    reader = anthropic.Anthropic(base_url=gateway.url, api_key=usage_only, max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        reader.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    usage = httpx.get(gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {usage_only}"})
    assert usage.status_code == 200
    assert [m.id for m in client.models.list()]  # the listing is open to every key
    # the other key: completions, but not the team's usage nor the batch tier
    assert chat.chat.completions.create(**ASK).choices[0].message.content == "tok "
    denied = httpx.get(gateway.url + "/v1/usage", headers={"Authorization": f"Bearer {chat_only}"})
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"
    assert "usage" in denied.json()["error"]["message"]
    assert _refused(lambda: chat.files.list()) == "insufficient_scope"
    assert _refused(lambda: chat.batches.list()) == "insufficient_scope"


def test_a_key_narrows_its_teams_kinds_and_changes_apply(gateway: Gateway, sql: Any) -> None:
    name = "scoped-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name, scopes="completions,usage")
    plain = keys.create_key(sql, name).key  # the team's kinds
    outside = keys.create_key(sql, name, limits={"scopes": "batch"}).key  # shares none
    assert gateway.client(plain).chat.completions.create(**ASK).choices
    assert _refused(lambda: gateway.client(plain).files.list()) == "insufficient_scope"
    assert _refused(lambda: gateway.client(outside).chat.completions.create(**ASK))
    assert _refused(lambda: gateway.client(outside).files.list())
    # the team opened to every kind: the key's own scope alone holds
    teams.update_team(sql, name, scopes="")

    def opened() -> bool:
        try:
            gateway.client(outside).files.list()
        except openai.PermissionDeniedError:
            return False
        return True

    wait_until(opened, 10, "the team's change to reach the key cache")
    assert _refused(lambda: gateway.client(outside).chat.completions.create(**ASK))
    with pytest.raises(ValueError, match="no scope"):
        keys.update_key(sql, keys.list_keys(sql, name)[0].prefix, scopes="everything")
