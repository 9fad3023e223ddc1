"""Commercial models through the gateway, against local servers that speak OpenAI's, Anthropic's,
Azure OpenAI's and Entra ID's wire protocols: the served model is named, a failure before the first
byte falls back to the next model (or, for a model at several deployments, moves to another
deployment), the breaker opens, half-opens and closes across requests, a stream cut mid-way ends
with an error event instead of a second answer, and Azure deployments take keys or Entra ID
tokens."""

import base64
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest

from tests.admin_ui.conftest import csrf_of, sign_in
from tests.backends.conftest import (
    AWS_KEYS,
    bedrock_url,  # noqa: F401 - a fixture
    control,
    gemini_url,  # noqa: F401 - a fixture
    grants,
    start_server,
    stats,
    token_server,  # noqa: F401 - a fixture
    vertex_url,  # noqa: F401 - a fixture
    write_service_account,
)
from tests.backends.conftest import HERE as BACKENDS
from tests.backends.fake_anthropic import THOUGHT
from tests.backends.test_backends_gemini import WEATHER
from tests.gateway.conftest import reservations, wait_until
from tests.guard.conftest import Texts, classifier, texts  # noqa: F401 - fixtures
from tokenyard.gateway.quotas import TeamKeys
from tokenyard.guard import store
from tokenyard.guard.policy import DEFAULT, apply, parse_change
from tokenyard.tenancy import keys

# start_gateway(name=…) sets TOKENYARD_<NAME>: the keys reach the gateway's environment that way
OPENAI_KEY, ANTHROPIC_KEY = "TOKENYARD_TEST_OPENAI_KEY", "TOKENYARD_TEST_ANTHROPIC_KEY"
ADMIN = "pw-" + os.urandom(6).hex()


@pytest.fixture(scope="module")
def providers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("providers")
    oa, oa_url = start_server(BACKENDS / "fake_openai.py", logs / "openai.log")
    an, an_url = start_server(BACKENDS / "fake_anthropic.py", logs / "anthropic.log")
    yield {"openai": oa_url, "anthropic": an_url}
    oa.stop()
    an.stop()


@pytest.fixture
def gw(start_gateway: Any, providers: dict[str, str], tmp_path: Path) -> Any:
    return _gateway(start_gateway, providers, tmp_path)


def _gateway(
    start_gateway: Any,
    providers: dict[str, str],
    tmp_path: Path,
    extra: str = "",
    extra_env: dict[str, str] | None = None,
    **settings: str,
) -> Any:
    """A gateway over the two providers; `extra`: more TOML lines for claude-fake (or more
    models); `extra_env` and `settings`: the gateway's own."""
    for url in providers.values():
        control(url, reset=True)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        f"""
[[models]]
id = "gpt-fake"
provider = "openai"
upstream_model = "gpt-4o-mini"
base_urls = ["{providers["openai"]}/v1"]
api_key_env = "{OPENAI_KEY}"
price = {{ input = 0.15, cached_input = 0.075, output = 0.6 }}
fallbacks = ["claude-fake"]

[[models]]
id = "o-fake"
provider = "openai"
upstream_model = "o4-mini"
base_urls = ["{providers["openai"]}/v1"]
api_key_env = "{OPENAI_KEY}"
price = {{ input = 1.1, cached_input = 0.275, output = 4.4 }}
max_tokens_param = "max_completion_tokens"

[[models]]
id = "image-fake"
provider = "openai"
kind = "image"
upstream_model = "gpt-image-1"
base_urls = ["{providers["openai"]}/v1"]
api_key_env = "{OPENAI_KEY}"
price = {{ input = 5.0, output = 40.0 }}

[[models]]
id = "claude-fake"
provider = "anthropic"
upstream_model = "claude-3-5-haiku-latest"
base_urls = ["{providers["anthropic"]}"]
api_key_env = "{ANTHROPIC_KEY}"
price = {{ input = 0.8, cached_input = 0.08, cache_write_input = 1.0, output = 4.0 }}
"""
        + extra
    )
    return start_gateway(
        extra_env,
        catalog=str(catalog),
        test_openai_key="sk-test-openai",
        test_anthropic_key="sk-ant-test",
        backend_retry_attempts="2",
        backend_retry_backoff_s="0.01",
        backend_breaker_failures="2",
        backend_breaker_open_s="1",
        **settings,
    )


def _claude(providers: dict[str, str], model_id: str, supports: str) -> str:
    """Catalog lines for one more model on the fake Anthropic, with capability flags."""
    return f"""
[[models]]
id = "{model_id}"
provider = "anthropic"
upstream_model = "claude-sonnet-4-5"
base_urls = ["{providers["anthropic"]}"]
api_key_env = "{ANTHROPIC_KEY}"
price = {{ input = 0.8, output = 4.0 }}
supports = {{ {supports} }}
"""


CHAT = [{"role": "user", "content": "Say something #chunks=3"}]


def settled(redis_server: Any, team: str) -> None:
    """The team's requests gave back every lease (commercial models hold no KV pages)."""
    idle = {"leases": 0, "pages": 0, "platform_leases": 0}
    wait_until(lambda: reservations(redis_server.client(), team) == idle, 2, "leases released")


def test_openai_and_anthropic_models_serve_through_the_gateway(
    gw: Any, team: Any, redis_server: Any
) -> None:
    name, key = team(concurrency=4)
    client = gw.client(key)
    reply = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=CHAT)
    assert reply.headers["x-tokenyard-model"] == "gpt-fake"
    completion = reply.parse()
    assert completion.model == "gpt-fake" and completion.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="claude-fake",
            messages=[{"role": "system", "content": "be brief"}, *CHAT],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and all(c.model == "claude-fake" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    models = {m.id: m for m in client.models.list().data}
    assert models["gpt-fake"].owned_by == "openai" and models["gpt-fake"].model_extra["ready"]
    assert models["claude-fake"].model_extra["circuit"] == "closed"
    # settled: commercial models hold no KV pages, and give their leases back like any other
    settled(redis_server, name)


def test_azure_serves_every_client_and_shares_a_model_with_openai(
    start_gateway: Any, team: Any, providers: dict[str, str], redis_server: Any, tmp_path: Path
) -> None:
    """Azure OpenAI through the gateway: its stream's opening chunk of no choices (the prompt's
    content filters) and its annotations neither break OpenAI's clients nor the translation for
    Anthropic's; usage settles as for OpenAI."""
    server, url = start_server(BACKENDS / "fake_azure.py", tmp_path / "azure.log")
    try:
        extra = f"""
[[models]]
id = "azure-4o"
provider = "azure"
base_urls = ["{url}/openai/deployments/prod-4o"]
api_version = "2024-10-21"
api_key_env = "{OPENAI_KEY}"
price = {{ input = 2.5, output = 10.0 }}

[[models]]
id = "any-4o"
provider = "azure"
price = {{ input = 2.5, output = 10.0 }}

[[models.deployments]]
name = "eu"
base_url = "{url}/openai/deployments/prod-4o"
api_version = "2024-10-21"
api_key_env = "{OPENAI_KEY}"
tags = ["eu"]

[[models.deployments]]
name = "us"
provider = "openai"
base_url = "{providers["openai"]}/v1"
api_key_env = "{OPENAI_KEY}"
upstream_model = "gpt-4o"
weight = 1e6
tags = ["us"]
"""
        gateway = _gateway(
            start_gateway, providers, tmp_path, extra, admin_user="owner", admin_password=ADMIN
        )
        name, key = team()
        client = gateway.client(key)
        reply = client.chat.completions.create(model="azure-4o", messages=CHAT)
        assert reply.model == "azure-4o" and reply.choices[0].message.content == "w0 w1 w2 "
        assert reply.usage is not None and reply.usage.completion_tokens == 3
        chunks = list(client.chat.completions.create(model="azure-4o", messages=CHAT, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "
        assert stats(url)["deployment"] == "prod-4o"
        claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
        with claude.messages.stream(model="azure-4o", max_tokens=8, messages=CHAT) as stream:
            assert "".join(stream.text_stream) == "w0 w1 w2 "
            assert stream.get_final_message().usage.output_tokens == 3
        # a team bound to deployments tagged eu: never OpenAI's, whatever its weight, and no
        # model without one
        _, eu_key = team(deployment_tags="eu")
        eu_client = gateway.client(eu_key)
        for i in range(2):
            asked = [{"role": "user", "content": f"eu {i} #chunks=2"}]
            assert (
                eu_client.chat.completions.create(model="any-4o", messages=asked).model == "any-4o"
            )
        assert stats(providers["openai"])["requests"] == 0
        with pytest.raises(openai.NotFoundError, match="no deployment tagged eu"):
            eu_client.chat.completions.create(model="gpt-fake", messages=CHAT)
        assert [m.id for m in eu_client.models.list().data] == ["any-4o", "auto"]
        # a model at two deployments: OpenAI's (all traffic by weight) asks for 30 s, Azure's
        # answers at once, and the client never hears of it, nor of another model
        at_azure = stats(url)["requests"]
        control(providers["openai"], fail_next=1, status=429, retry_after=30)
        for i in range(3):
            started = time.monotonic()
            reply = client.chat.completions.with_raw_response.create(
                model="any-4o", messages=[{"role": "user", "content": f"hi {i} #chunks=2"}]
            )
            assert reply.headers["x-tokenyard-model"] == "any-4o"
            assert reply.parse().model == "any-4o" and time.monotonic() - started < 3
        assert (stats(providers["openai"])["requests"], stats(url)["requests"]) == (1, at_azure + 3)
        metrics = httpx.get(gateway.url + "/metrics").text
        series = "tokenyard_backend_deployment_requests_total"
        assert f'{series}{{backend="any-4o",deployment="us",outcome="retried"}} 1.0' in metrics
        assert f'{series}{{backend="any-4o",deployment="eu",outcome="answered"}} 5.0' in metrics
        # the operator's status page shows where each deployment stands
        status = sign_in(gateway.url, "owner", ADMIN).get("/admin/status").text
        rows = re.findall(
            r"<td>(eu|us)</td>\s*<td class=\"num\">0</td>\s*<td class=\"(\w+)\">", status
        )
        assert sorted(rows) == [("eu", "ok"), ("us", "bad")]
        settled(redis_server, name)
    finally:
        server.stop()


def test_azure_deployments_without_keys_take_entra_id_tokens(
    start_gateway: Any,
    team: Any,
    providers: dict[str, str],
    token_server: tuple[str, Path],  # noqa: F811 - the fixture imported above
    redis_server: Any,
    tmp_path: Path,
) -> None:
    """Three Azure models with keys turned off: the identity the environment gives (a service
    principal in AZURE_* variables), one the catalog names, one whose secret is wrong. Each token
    is fetched once over TLS and sent as a bearer token; a refused one is a 503, not a crash."""
    login, ca = token_server
    server, url = start_server(BACKENDS / "fake_azure.py", tmp_path / "azure.log")
    try:
        where = f"""provider = "azure"
base_urls = ["{url}/openai/deployments/prod-4o"]
api_version = "2024-10-21"
price = {{ input = 2.5, output = 10.0 }}"""
        extra = f"""
[[models]]
id = "azure-env"
{where}
entra = {{}}

[[models]]
id = "azure-sp"
{where}
entra = {{ tenant_id = "contoso", client_id = "sp", client_secret_env = "TOKENYARD_TEST_SP" }}

[[models]]
id = "azure-bad"
{where}
entra = {{ tenant_id = "contoso", client_id = "typo", client_secret_env = "TOKENYARD_TEST_BAD" }}
"""
        environment = {
            "SSL_CERT_FILE": str(ca),  # the fake login host's authority, trusted
            "AZURE_AUTHORITY_HOST": login,
            "AZURE_TENANT_ID": "fabrikam",
            "AZURE_CLIENT_ID": "gateway",
            "AZURE_CLIENT_SECRET": "env-secret",
        }
        gateway = _gateway(
            start_gateway,
            providers,
            tmp_path,
            extra,
            environment,
            test_sp="sp-secret",
            test_bad="wrong",
        )
        name, key = team()
        client = gateway.client(key)
        for model, token in (
            ("azure-env", "entra.fabrikam.gateway."),
            ("azure-sp", "entra.contoso.sp."),
        ):
            for _ in range(2):
                reply = client.chat.completions.create(model=model, messages=CHAT)
                assert reply.model == model and reply.choices[0].message.content == "w0 w1 w2 "
                assert stats(url)["last_headers"]["authorization"].startswith("Bearer " + token)
            chunks = list(client.chat.completions.create(model=model, messages=CHAT, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="azure-bad", messages=CHAT)
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "upstream_unavailable"  # type: ignore[index]
        seen = grants(login, ca)
        asked = [(g["tenant"], g["client_id"], g["client_secret"]) for g in seen]
        # one token per identity for its six requests; the wrong secret asked once per try
        assert asked[:2] == [("fabrikam", "gateway", "env-secret"), ("contoso", "sp", "sp-secret")]
        assert set(asked[2:]) == {("contoso", "typo", "wrong")}
        scopes = {(g["scope"], g["grant_type"]) for g in seen}
        assert scopes == {("https://cognitiveservices.azure.com/.default", "client_credentials")}
        settled(redis_server, name)
    finally:
        server.stop()


def test_models_on_vertex_and_bedrock_serve_every_client(
    start_gateway: Any,
    team: Any,
    providers: dict[str, str],
    token_server: tuple[str, Path],  # noqa: F811 - the fixtures imported above
    vertex_url: str,  # noqa: F811
    bedrock_url: str,  # noqa: F811
    redis_server: Any,
    tmp_path: Path,
) -> None:
    """One gateway, Anthropic's models at Google Cloud and at AWS, neither with a key: a service
    account's token for one, requests signed with the environment's AWS credentials for the
    other. OpenAI's client (whole and streamed) and Anthropic's (stream, token count) get the
    same answers as from Anthropic itself, and from Llama on Bedrock through Converse; usage
    settles."""
    login, ca = token_server
    account, _ = write_service_account(tmp_path, login + "/token")
    for url in (vertex_url, bedrock_url):
        control(url, reset=True)
    extra = f"""
[[models]]
id = "claude-vertex"
provider = "vertex"
upstream_model = "claude-sonnet-4@20250514"
base_urls = ["{vertex_url}/v1/projects/proj/locations/us-east5"]
price = {{ input = 3.0, output = 15.0 }}

[[models]]
id = "claude-bedrock"
provider = "bedrock"
upstream_model = "anthropic.claude-3-5-haiku-20241022-v1:0"
base_urls = ["{bedrock_url}"]
region = "us-west-2"
price = {{ input = 0.8, output = 4.0 }}

[[models]]
id = "llama-bedrock"
provider = "bedrock-converse"
upstream_model = "us.meta.llama3-3-70b-instruct-v1:0"
base_urls = ["{bedrock_url}"]
region = "us-west-2"
price = {{ input = 0.72, output = 0.72 }}
"""
    environment = {
        "GOOGLE_APPLICATION_CREDENTIALS": str(account),
        "REQUESTS_CA_BUNDLE": str(ca),
        "AWS_ACCESS_KEY_ID": AWS_KEYS["access"],
        "AWS_SECRET_ACCESS_KEY": AWS_KEYS["secret"],
    }
    gateway = _gateway(start_gateway, providers, tmp_path, extra, environment)
    name, key = team()
    client = gateway.client(key)
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    for model, fake in (("claude-vertex", vertex_url), ("claude-bedrock", bedrock_url)):
        reply = client.chat.completions.create(model=model, messages=CHAT)
        assert reply.model == model and reply.choices[0].message.content == "w0 w1 w2 "
        assert reply.usage is not None and reply.usage.completion_tokens == 3
        chunks = list(client.chat.completions.create(model=model, messages=CHAT, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "
        with claude.messages.stream(model=model, max_tokens=8, messages=CHAT) as stream:
            assert "".join(stream.text_stream) == "w0 w1 w2 "
        counted = claude.messages.with_raw_response.count_tokens(model=model, messages=CHAT)
        assert counted.parse().input_tokens == 3  # "Say something #chunks=3": the fake's words
        assert counted.headers["x-tokenyard-token-count"] == "exact"
        assert stats(fake)["model"] != ""
    assert stats(vertex_url)["token"].startswith("ya29.fake.")
    assert stats(bedrock_url)["auth"] == "sigv4"
    # any other model on Bedrock, through Converse: the same answers to both clients
    reply = client.chat.completions.create(model="llama-bedrock", messages=CHAT)
    assert (
        reply.choices[0].message.content == "w0 w1 w2 " and stats(bedrock_url)["verb"] == "converse"
    )
    with claude.messages.stream(model="llama-bedrock", max_tokens=8, messages=CHAT) as stream:
        assert "".join(stream.text_stream) == "w0 w1 w2 "
    assert stats(bedrock_url)["verb"] == "converse-stream"
    counted = claude.messages.with_raw_response.count_tokens(model="llama-bedrock", messages=CHAT)
    assert counted.headers["x-tokenyard-token-count"] == "estimate"
    settled(redis_server, name)


def test_gemini_serves_every_client_with_its_tool_calls_and_usage(
    start_gateway: Any,
    team: Any,
    providers: dict[str, str],
    gemini_url: str,  # noqa: F811 - the fixture imported above
    redis_server: Any,
    tmp_path: Path,
) -> None:
    """A Gemini 3 model at Google AI Studio: OpenAI's client gets its answers whole and streamed,
    and a tool call whose id carries the thought signature Gemini needs back in the next turn;
    Google's own client (through the gateway's Gemini front) and Anthropic's count tokens with
    Gemini's countTokens; Gemini's own block is OpenAI's content_policy_violation; usage
    settles."""
    control(gemini_url, reset=True)
    extra = f"""
[[models]]
id = "gemini-fake"
provider = "gemini"
upstream_model = "gemini-3-pro-preview"
base_urls = ["{gemini_url}/v1beta"]
api_key_env = "TOKENYARD_TEST_GEMINI_KEY"
price = {{ input = 2.0, output = 12.0 }}
supports = {{ tools = true, structured_outputs = true, reasoning = true }}
"""
    gateway = _gateway(start_gateway, providers, tmp_path, extra, test_gemini_key="gm-test")
    name, key = team()
    client = gateway.client(key)
    reply = client.chat.completions.create(
        model="gemini-fake", messages=CHAT, reasoning_effort="low"
    )
    assert reply.model == "gemini-fake" and reply.choices[0].message.content == "w0 w1 w2 "
    sent = stats(gemini_url)
    assert sent["key"] == "gm-test" and sent["model"] == "gemini-3-pro-preview"
    assert sent["last_body"]["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 1024}
    chunks = list(
        client.chat.completions.create(
            model="gemini-fake", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3

    ask: list[Any] = [{"role": "user", "content": "Weather in Paris? #tool"}]
    called = client.chat.completions.create(model="gemini-fake", messages=ask, tools=[WEATHER])
    message = called.choices[0].message
    assert called.choices[0].finish_reason == "tool_calls" and message.tool_calls
    answer = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "21C"}
    history = [*ask, message.model_dump(exclude_none=True), answer]
    done = client.chat.completions.create(model="gemini-fake", messages=history, tools=[WEATHER])
    assert done.choices[0].message.content == "w0 w1 w2 w3 w4 "  # the fake took the signature
    # the Responses API (Codex, the Agents SDK) on Gemini: translated onto chat, tools included
    response = client.responses.create(model="gemini-fake", input="Say hi #chunks=2")
    assert response.output_text == "w0 w1 " and response.usage is not None
    weather = {
        "type": "function",
        "name": "weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    asked = client.responses.create(model="gemini-fake", input="Paris? #tool", tools=[weather])
    (called,) = [item for item in asked.output if item.type == "function_call"]
    answered = client.responses.create(
        model="gemini-fake",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": called.call_id, "output": "21C"}],
        tools=[weather],
    )
    assert answered.output_text == "w0 w1 w2 w3 w4 "  # the signature survived the stored turn

    google = gateway.gemini(key)  # held: the SDK's client closes its connections when dropped
    assert google.models.generate_content(model="gemini-fake", contents="hi #chunks=2").text == (
        "w0 w1 "
    )
    counted = google.models.count_tokens(model="gemini-fake", contents="one two three")
    assert counted.total_tokens == 3 and stats(gemini_url)["verb"] == "countTokens"
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    raw = claude.messages.with_raw_response.count_tokens(
        model="gemini-fake", messages=[{"role": "user", "content": "four five"}]
    )
    assert raw.parse().input_tokens == 2 and raw.headers["x-tokenyard-token-count"] == "exact"

    with pytest.raises(openai.BadRequestError) as blocked:
        client.chat.completions.create(
            model="gemini-fake", messages=[{"role": "user", "content": "x #blocked"}]
        )
    assert blocked.value.code == "content_policy_violation"
    settled(redis_server, name)


def test_a_deployments_tpm_counts_each_requests_prompt_and_cap(
    start_gateway: Any, team: Any, providers: dict[str, str], redis_server: Any, tmp_path: Path
) -> None:
    """An Azure deployment with 300 tokens a minute, preferred: the first request (its prompt and
    its 200-token cap) fits, the second would pass the quota, so OpenAI's deployment answers it
    before Azure could refuse it."""
    server, url = start_server(BACKENDS / "fake_azure.py", tmp_path / "azure.log")
    try:
        extra = f"""
[[models]]
id = "quota-4o"
provider = "azure"
price = {{ input = 2.5, output = 10.0 }}

[[models.deployments]]
name = "azure"
base_url = "{url}/openai/deployments/prod-4o"
api_version = "2024-10-21"
api_key_env = "{OPENAI_KEY}"
tpm = 300
weight = 1e6

[[models.deployments]]
name = "openai"
provider = "openai"
base_url = "{providers["openai"]}/v1"
api_key_env = "{OPENAI_KEY}"
"""
        gateway = _gateway(
            start_gateway, providers, tmp_path, extra, admin_user="owner", admin_password=ADMIN
        )
        redis = redis_server.client()
        if int(redis.time()[0]) % 60 > 54:  # the window would turn over mid-test
            time.sleep(61 - int(redis.time()[0]) % 60)
        name, key = team()
        client = gateway.client(key)
        for _ in range(2):
            reply = client.chat.completions.create(model="quota-4o", messages=CHAT, max_tokens=200)
            assert reply.choices[0].message.content == "w0 w1 w2 "
        assert (stats(url)["requests"], stats(providers["openai"])["requests"]) == (1, 1)
        settled(redis_server, name)
        # the operator sees the quota's use this minute, and checks every deployment on request
        operator = sign_in(gateway.url, "owner", ADMIN)
        page = operator.get("/admin/status")
        used = re.search(r"([\d,]+) of 300 tokens", page.text)
        assert used is not None and 200 < int(used.group(1).replace(",", "")) <= 300
        before = stats(url)["requests"]
        checked = operator.post("/admin/status/check", data={"csrf": csrf_of(page)})
        assert checked.status_code == 200
        rows = re.findall(
            r"<td>quota-4o</td>\s*<td>(\w+)</td>\s*<td class=\"(\w+)\">", checked.text
        )
        assert sorted(rows) == [("azure", "ok"), ("openai", "ok")]
        assert stats(url)["requests"] == before + 1  # the check asked it, its limit aside
    finally:
        server.stop()


def test_failure_before_first_byte_falls_back_and_the_breaker_cycles(
    gw: Any, team: Any, providers: dict[str, str]
) -> None:
    _, key = team()
    client = gw.client(key)
    control(providers["openai"], fail_next=100, status=503)  # an outage: every team's problem
    for _ in range(2):  # each: 2 attempts at gpt-fake, then claude-fake serves
        reply = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=CHAT)
        assert reply.headers["x-tokenyard-model"] == "claude-fake"
        assert reply.parse().choices[0].message.content
    assert stats(providers["openai"])["requests"] == 4
    # two failed requests opened gpt-fake's breaker: it is skipped without being called
    reply = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=CHAT)
    assert reply.headers["x-tokenyard-model"] == "claude-fake"
    assert stats(providers["openai"])["requests"] == 4
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'tokenyard_router_fallbacks_total{from_model="gpt-fake",to_model="claude-fake"} 2.0' in (
        metrics
    )
    assert 'tokenyard_router_overflows_total{model="gpt-fake",reason="down"}' in metrics
    # the provider recovers; after the open time one probe goes through and closes the breaker
    control(providers["openai"], reset=True)

    def served_by_openai() -> bool:
        r = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=CHAT)
        return r.headers["x-tokenyard-model"] == "gpt-fake"

    wait_until(served_by_openai, 5, "the half-open probe")
    cards = {m.id: m.model_extra for m in client.models.list().data}
    assert cards["gpt-fake"]["circuit"] == "closed"


def test_a_fallback_is_held_to_the_teams_limits_on_its_own_model(
    gw: Any, team: Any, providers: dict[str, str], redis_server: Any
) -> None:
    """A request whose model fails before its first byte goes to the fallback only within the
    team's limits on the fallback, as if it had been routed there: its reserved tokens move from
    the failed model's bucket to the fallback's, and with the fallback's requests per minute spent
    the failure itself is the answer (it is not served past the team's limit there)."""
    name, key = team(
        model_limits={"gpt-fake": {"tpm": 10_000}, "claude-fake": {"rpm": 1, "tpm": 10_000}}
    )
    client = gw.client(key).with_options(max_retries=0)
    r, keys = redis_server.client(), TeamKeys(name)

    def level(model: str) -> float:
        return float(r.hget(keys.model_tpm(model), "level") or -1)

    control(providers["openai"], fail_next=100, status=503)
    reply = client.chat.completions.with_raw_response.create(
        model="gpt-fake", messages=CHAT, max_tokens=50
    )
    assert reply.headers["x-tokenyard-model"] == "claude-fake"
    used = reply.parse().usage.total_tokens
    # the failed model lent its reservation back whole; the fallback is charged what it used
    wait_until(lambda: level("claude-fake") == 10_000 - used, 2, "the fallback's tokens settled")
    assert level("gpt-fake") == 10_000
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="gpt-fake", messages=CHAT, max_tokens=50)
    assert err.value.status_code == 503 and err.value.code == "upstream_unavailable"
    assert stats(providers["anthropic"])["requests"] == 1
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'tokenyard_router_overflows_total{model="claude-fake",reason="team_model_limit"}' in (
        metrics
    )
    _recovered(client, providers)


def test_a_fallback_gets_the_output_cap_its_own_context_leaves(
    start_gateway: Any, team: Any, providers: dict[str, str], tmp_path: Path
) -> None:
    """A fallback with a smaller context window than the model that failed is sent the output
    cap its window leaves, not the failed model's; where the output asked for cannot fit it, it
    is passed over (here: nothing left, the failure is the answer)."""
    gw = _gateway(start_gateway, providers, tmp_path, "max_context = 60\n")
    _, key = team()
    client = gw.client(key).with_options(max_retries=0)
    control(providers["openai"], fail_next=100, status=503)
    reply = client.chat.completions.with_raw_response.create(model="gpt-fake", messages=CHAT)
    assert reply.headers["x-tokenyard-model"] == "claude-fake"
    sent = stats(providers["anthropic"])["last_body"]["max_tokens"]
    assert 40 <= sent < 60  # the window less the prompt, not the platform's 4096
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="gpt-fake", messages=CHAT, max_tokens=100)
    assert err.value.status_code == 503 and err.value.code == "upstream_unavailable"
    assert stats(providers["anthropic"])["requests"] == 1
    _recovered(client, providers)


def test_an_overflow_passes_over_a_model_whose_context_cannot_hold_the_request(
    start_gateway: Any, team: Any, providers: dict[str, str], tmp_path: Path
) -> None:
    """Past a team's limit on the model it asked for, a fallback whose window cannot hold the
    request is passed over: the client hears of the limit it met (429), not of a context it never
    asked to fit (400). Where the fallback fits, it serves."""
    gw = _gateway(start_gateway, providers, tmp_path, "max_context = 60\n")
    _, key = team(model_limits={"gpt-fake": {"rpm": 1}})
    client = gw.client(key).with_options(max_retries=0)

    def ask(max_tokens: int) -> Any:
        return client.chat.completions.with_raw_response.create(
            model="gpt-fake", messages=CHAT, max_tokens=max_tokens
        )

    assert ask(100).headers["x-tokenyard-model"] == "gpt-fake"
    with pytest.raises(openai.RateLimitError) as err:
        ask(100)  # gpt-fake's limit spent; claude-fake's 60 tokens cannot hold 100 more
    assert err.value.code == "model_requests_per_minute" and "'gpt-fake'" in err.value.message
    assert ask(10).headers["x-tokenyard-model"] == "claude-fake"


def _recovered(client: openai.OpenAI, providers: dict[str, str]) -> None:
    """The OpenAI fake healthy again, and gpt-fake serving once its breaker (in Redis, shared
    with the next test's gateway) has closed."""
    control(providers["openai"], reset=True)
    wait_until(
        lambda: (
            client.chat.completions.with_raw_response.create(
                model="gpt-fake", messages=CHAT
            ).headers["x-tokenyard-model"]
            == "gpt-fake"
        ),
        5,
        "gpt-fake's breaker closed",
    )


def test_stream_cut_mid_way_ends_with_an_error_event_and_no_second_answer(
    gw: Any, team: Any, providers: dict[str, str]
) -> None:
    _, key = team()
    body = {
        "model": "gpt-fake",
        "messages": [{"role": "user", "content": "long answer #chunks=8 #cut=4"}],
        "stream": True,
    }
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] != "[DONE]"
    error = json.loads(events[-1])["error"]
    assert error["code"] == "upstream_error"
    content = [json.loads(e) for e in events[:-1]]
    assert content and all(c["model"] == "gpt-fake" for c in content)
    assert stats(providers["openai"])["requests"] == 1  # never retried after the first byte
    assert stats(providers["anthropic"])["requests"] == 0  # and never answered twice


def test_the_output_cap_goes_by_the_name_each_model_takes(
    gw: Any, team: Any, providers: dict[str, str]
) -> None:
    """OpenAI's reasoning models refuse max_tokens: the catalog names their field, and the cap the
    gateway forwards (the client's, whichever name it used) goes by it; other models keep
    max_tokens."""
    _, key = team()
    client = gw.client(key)
    for model, asked, sent, not_sent in (
        ("o-fake", {"max_tokens": 7}, "max_completion_tokens", "max_tokens"),
        ("o-fake", {"max_completion_tokens": 7}, "max_completion_tokens", "max_tokens"),
        ("gpt-fake", {"max_completion_tokens": 7}, "max_tokens", "max_completion_tokens"),
    ):
        client.chat.completions.create(model=model, messages=CHAT, **asked)
        body = stats(providers["openai"])["last_body"]
        assert body[sent] == 7 and not_sent not in body, (model, asked, body)


def test_anthropic_cache_writes_are_reported_and_charged_their_own_price(
    gw: Any, team: Any
) -> None:
    """Anthropic's cache_creation_input_tokens (a premium over input) come back in OpenAI's usage
    as cache_write_tokens and in Anthropic's as itself, and the request is charged for them at
    the catalog's cache_write_input."""
    _, key = team()
    words = "one two three four five six seven eight nine ten"
    ask = [{"role": "user", "content": words + " #cached=3 #written=4"}]
    usage = gw.client(key).chat.completions.create(model="claude-fake", messages=ask).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    details = usage.prompt_tokens_details.model_dump()
    assert (details["cached_tokens"], details["cache_write_tokens"]) == (3, 4)
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
    message = claude.messages.create(model="claude-fake", max_tokens=20, messages=ask)  # type: ignore[arg-type]
    assert message.usage.cache_creation_input_tokens == 4
    assert message.usage.cache_read_input_tokens == 3
    assert message.usage.input_tokens == usage.prompt_tokens - 7

    def logged() -> list[dict[str, Any]]:
        answer = httpx.get(
            gw.url + "/v1/usage/requests", headers={"authorization": f"Bearer {key}"}
        )
        return answer.json()["data"]

    wait_until(lambda: len(logged()) == 2, 10, "both requests recorded")
    plain = usage.prompt_tokens - 3 - 4
    premium = (plain * 0.8 + 3 * 0.08 + 4 * 1.0 + usage.completion_tokens * 4.0) / 1e6
    chat = logged()[-1]  # the chat request, the older
    assert chat["cost_usd"] == pytest.approx(premium) and chat["cache_write_tokens"] == 4


def test_anthropics_client_thinks_through_the_gateway_and_sends_its_thinking_back(
    start_gateway: Any, providers: dict[str, str], team: Any, tmp_path: Path
) -> None:
    """Anthropic's SDK asks for extended thinking on /v1/messages: the budget reaches Claude to
    the token, the reply starts with the signed thinking block, whole and streamed (thinking and
    signature deltas), and sent back before a tool result it is the block Claude signed (the fake
    checks the signature). A model that cannot think refuses the field; one on OpenAI's API never
    sees the blocks of a history that carries them."""
    extra = _claude(providers, "claude-think", "tools = true, reasoning = true")
    gateway = _gateway(start_gateway, providers, tmp_path, extra)
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=team()[1], max_retries=0)
    tool = {"name": "weather", "input_schema": {"type": "object"}}
    ask: Any = {
        "model": "claude-think",
        "max_tokens": 3000,
        "thinking": {"type": "enabled", "budget_tokens": 1536},
        "tools": [tool],
        "messages": [{"role": "user", "content": "Weather in Paris? #tool"}],
    }
    message = claude.messages.create(**ask)
    assert stats(providers["anthropic"])["last_body"]["thinking"] == ask["thinking"]
    thought, _, use = message.content
    assert thought.type == "thinking" and thought.signature and thought.thinking
    assert use.type == "tool_use" and message.stop_reason == "tool_use"
    with claude.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].model_dump() == thought.model_dump()

    def answer(block: dict[str, Any]) -> Any:
        turns = [
            *ask["messages"],
            {"role": "assistant", "content": [block, use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id}]},
        ]
        return claude.messages.create(**{**ask, "messages": turns})

    assert answer(thought.model_dump()).content[0].type == "thinking"
    sent = stats(providers["anthropic"])["last_body"]["messages"][1]["content"][0]
    assert sent == thought.model_dump()
    with pytest.raises(anthropic.BadRequestError) as forged:
        answer({**thought.model_dump(), "thinking": "Something else."})
    assert "signature" in str(forged.value.message)

    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(**{**ask, "model": "claude-fake"})
    assert "thinking" in str(refused.value.message)
    history = [
        *ask["messages"],
        {"role": "assistant", "content": [thought.model_dump(), {"type": "text", "text": "x"}]},
        {"role": "user", "content": "and Rome?"},
    ]
    claude.messages.create(model="gpt-fake", max_tokens=50, messages=history)
    turns = stats(providers["openai"])["last_body"]["messages"]
    assert turns[1] == {"role": "assistant", "content": "x"}
    # counted without an output cap: a budget past the default cap is no reason to refuse
    big = {"type": "enabled", "budget_tokens": 8192}
    counted = claude.messages.count_tokens(
        model="claude-think", messages=ask["messages"], thinking=big
    )
    assert (
        counted.input_tokens > 0 and stats(providers["anthropic"])["last_body"]["thinking"] == big
    )

    # a model that thinks only adaptively (Opus 4.7: the fake, as Anthropic, refuses a budget):
    # the catalog says so, and reasoning_effort asks it that way; Anthropic's client asks as is
    adaptive = _claude(providers, "claude-adaptive", "reasoning = true").replace(
        "claude-sonnet-4-5", "claude-opus-4-7"
    )
    gateway = _gateway(start_gateway, providers, tmp_path, adaptive + 'thinking = "adaptive"\n')
    key = team()[1]
    chat = gateway.client(key).chat.completions.create(
        model="claude-adaptive",
        messages=[{"role": "user", "content": "hi"}],
        reasoning_effort="high",
    )
    assert chat.choices[0].message.model_extra["reasoning_content"] == THOUGHT
    sent = stats(providers["anthropic"])["last_body"]
    assert (sent["thinking"], sent["output_config"]) == ({"type": "adaptive"}, {"effort": "high"})
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0)
    asked: Any = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    message = claude.messages.create(
        model="claude-adaptive", max_tokens=100, messages=ask["messages"], **asked
    )
    assert message.content[0].type == "thinking"
    sent = stats(providers["anthropic"])["last_body"]
    assert {k: sent[k] for k in asked} == asked
    with pytest.raises(anthropic.BadRequestError) as budgeted:
        claude.messages.create(**{**ask, "model": "claude-adaptive"})
    assert "adaptive" in str(budgeted.value.message)


def test_structured_outputs_reach_anthropics_models_through_a_forced_tool(
    start_gateway: Any, providers: dict[str, str], team: Any, tmp_path: Path
) -> None:
    """OpenAI's client parses a Pydantic model out of a Claude model's answer, whole and
    streamed: the schema went out as the forced answer tool, its input came back as content."""

    class Place(pydantic.BaseModel):
        city: str

    extra = _claude(providers, "claude-json", "structured_outputs = true")
    gateway = _gateway(start_gateway, providers, tmp_path, extra)
    client = gateway.client(team()[1])
    ask: Any = [{"role": "user", "content": "Where is the Louvre?"}]
    parsed = client.chat.completions.parse(model="claude-json", messages=ask, response_format=Place)
    assert parsed.choices[0].message.parsed == Place(city="Paris")
    sent = stats(providers["anthropic"])["last_body"]
    assert sent["tools"][0]["input_schema"]["properties"] == {
        "city": {"title": "City", "type": "string"}
    }
    with client.chat.completions.stream(
        model="claude-json", messages=ask, response_format=Place
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == Place(city="Paris")


def test_images_are_generated_screened_limited_and_charged_by_their_tokens(
    gw: Any,
    team: Any,
    providers: dict[str, str],
    sql: Any,
    texts: Texts,  # noqa: F811 - the fixture imported above
) -> None:
    """OpenAI's image generation through the gateway: the SDK gets its images, the request is
    charged for the image tokens the provider reports at the model's output price, an image model
    serves nothing else and a chat model no images, a prompt the team's guard policy blocks and a
    key without the `images` scope are refused before anything is sent."""
    name, key = team()
    client = gw.client(key)
    made = client.images.with_raw_response.generate(
        model="image-fake", prompt="a red fox in snow", n=2, size="1024x1024", quality="low"
    )
    assert made.headers["x-tokenyard-model"] == "image-fake"
    images = made.parse()
    assert (
        len(images.data) == 2 and base64.b64decode(images.data[0].b64_json or "")[:4] == b"\x89PNG"
    )
    sent = stats(providers["openai"])
    assert sent["last_path"] == "/v1/images/generations"
    assert sent["last_body"] == {
        "model": "gpt-image-1",
        "prompt": "a red fox in snow",
        "n": 2,
        "size": "1024x1024",
        "quality": "low",
    }

    def logged() -> list[dict[str, Any]]:
        answer = httpx.get(
            gw.url + "/v1/usage/requests", headers={"authorization": f"Bearer {key}"}
        )
        return answer.json()["data"]

    wait_until(lambda: len(logged()) == 1, 10, "the request recorded")
    (record,) = logged()
    assert (record["prompt_tokens"], record["completion_tokens"]) == (5, 544)
    assert record["cost_usd"] == pytest.approx((5 * 5.0 + 544 * 40.0) / 1e6)
    with pytest.raises(openai.NotFoundError, match="image generation only"):
        client.chat.completions.create(model="image-fake", messages=CHAT)
    with pytest.raises(openai.NotFoundError, match="chat and completions only"):
        client.images.generate(model="gpt-fake", prompt="a fox")
    with pytest.raises(openai.BadRequestError):
        client.images.generate(model="image-fake", prompt="")
    requests_before = stats(providers["openai"])["requests"]
    restricted = keys.create_key(sql, name, limits={"scopes": "completions"}).key
    with pytest.raises(openai.PermissionDeniedError) as refused:
        gw.client(restricted).images.generate(model="image-fake", prompt="a fox")
    assert refused.value.code == "insufficient_scope"
    assert stats(providers["openai"])["requests"] == requests_before
    # a team whose policy blocks (set before its first request: gateways cache a team's policy)
    strict, strict_key = team()
    store.write_policy(sql, strict, apply(DEFAULT, [parse_change("input.*=block")]))
    with pytest.raises(openai.BadRequestError) as blocked:
        gw.client(strict_key).images.generate(model="image-fake", prompt=texts.harmful)
    assert blocked.value.code == "content_policy_violation"
    # the verdict came before the call: no image was begun (and paid for) at the provider
    assert stats(providers["openai"])["requests"] == requests_before


def test_token_counts_go_to_each_providers_own_counting_route(
    gw: Any, team: Any, providers: dict[str, str]
) -> None:
    """Anthropic's models count with Anthropic's count_tokens, OpenAI's a Responses request with
    OpenAI's input_tokens: only the fields each takes go (the fakes refuse any other, as the APIs
    do), under the provider's model name. A chat request for an OpenAI model has no counting route
    there: the gateway's own estimate answers, and says so. Refusals keep each client's shape."""
    _, key = team()
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
    turn: dict[str, Any] = {"messages": [{"role": "user", "content": "one two three"}]}
    raw = claude.messages.with_raw_response.count_tokens(
        model="claude-fake", system="be brief", **turn
    )
    assert raw.parse().input_tokens == 5  # the fake counts words: 2 + 3
    assert raw.headers["x-tokenyard-token-count"] == "exact"
    sent = stats(providers["anthropic"])["last_body"]
    assert sent["model"] == "claude-3-5-haiku-latest" and "max_tokens" not in sent

    client = gw.client(key)
    for model, provider in (("gpt-fake", "openai"), ("claude-fake", "anthropic")):
        raw = client.responses.input_tokens.with_raw_response.count(
            model=model, input="four five six seven", instructions="short"
        )
        assert raw.parse().input_tokens == (4 if provider == "openai" else 5), model
        assert raw.headers["x-tokenyard-token-count"] == "exact"
        assert stats(providers[provider])["requests"] >= 1
    assert stats(providers["openai"])["last_body"]["model"] == "gpt-4o-mini"

    raw = claude.messages.with_raw_response.count_tokens(model="gpt-fake", **turn)
    assert raw.headers["x-tokenyard-token-count"] == "estimate"
    assert raw.parse().input_tokens > 0

    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="no-such-model", **turn)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.input_tokens.count(model="no-such-model", input="hi")
    assert missing.value.code == "model_not_found"
    refused = {"messages": [{"role": "user", "content": "hi #status=400"}]}
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="claude-fake", **refused)
    with pytest.raises(anthropic.BadRequestError):  # the translation's own check
        claude.messages.count_tokens(model="claude-fake", messages=[{"role": "king"}])
