"""Anthropic's models on Google Cloud's Vertex AI as a backend: the fake is first proven to speak
Vertex's wire as the official `anthropic` SDK's AnthropicVertex client expects it, then the
platform's backend talks to it with an access token google-auth gets for a service account (its
key file in GOOGLE_APPLICATION_CREDENTIALS, its token endpoint the fake over TLS): the model in
the path, Vertex's API version in the body, replies translated to OpenAI's shapes as Anthropic's."""

from pathlib import Path
from typing import Any

import anthropic
import httpx
import msgspec
import pytest

from tests.backends.conftest import control, grants, stats
from tests.backends.test_backends_openai import call, events, read_stream
from tokenyard.router.catalog import Catalog, CatalogError, CatalogFile, ModelEntry

MODEL = "claude-sonnet-4@20250514"
ASK: Any = [{"role": "user", "content": "hello #chunks=3"}]


def test_the_fake_speaks_vertex_as_the_sdk_does(vertex_url: str) -> None:
    control(vertex_url, reset=True)
    client = anthropic.AnthropicVertex(
        region="us-east5", project_id="proj", access_token="ya29.sdk", base_url=vertex_url + "/v1"
    )
    reply = client.messages.create(model=MODEL, max_tokens=8, messages=ASK)
    assert reply.content[0].text == "w0 w1 w2 "  # type: ignore[union-attr]
    seen = stats(vertex_url)
    assert (seen["project"], seen["region"], seen["model"]) == ("proj", "us-east5", MODEL)
    assert (seen["verb"], seen["token"]) == ("rawPredict", "ya29.sdk")
    with client.messages.stream(model=MODEL, max_tokens=8, messages=ASK) as stream:
        assert "".join(stream.text_stream) == "w0 w1 w2 "
    assert stats(vertex_url)["verb"] == "streamRawPredict"
    assert client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens == 2
    assert stats(vertex_url)["model"] == "count-tokens"
    route = f"{vertex_url}/v1/projects/p/locations/r/publishers/anthropic/models/{MODEL}:rawPredict"
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 8, "messages": ASK}
    unsigned = httpx.post(route, json=body)
    assert unsigned.status_code == 401 and unsigned.json()["error"]["status"] == "UNAUTHENTICATED"
    named = httpx.post(route, json={**body, "model": MODEL}, headers={"authorization": "Bearer t"})
    assert named.status_code == 400  # Vertex names the model by the path alone


async def test_the_backend_calls_vertex_with_a_service_accounts_token(
    build_entry: Any, vertex_url: str, token_server: tuple[str, Path], service_account: str
) -> None:
    control(vertex_url, reset=True)
    base = f"{vertex_url}/v1/projects/proj/locations/us-east5"
    entry = ModelEntry(id="claude-v", provider="vertex", upstream_model=MODEL, base_urls=(base,))
    assert entry.configured  # no key: Google Cloud's credentials, found at the first request
    upstream = build_entry(entry)
    reply = await upstream.complete(call("hi #chunks=2"))
    assert reply.status == 200
    body = msgspec.json.decode(reply.body)
    assert body["model"] == "claude-v" and body["choices"][0]["message"]["content"] == "w0 w1 "
    seen = stats(vertex_url)
    assert (seen["model"], seen["verb"]) == (MODEL, "rawPredict")
    assert seen["token"].startswith("ya29.fake.")
    chunks = events(await read_stream(upstream, call("hi #chunks=2", stream=True)))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert stats(vertex_url)["verb"] == "streamRawPredict"
    counted = await upstream.count_tokens(call("one two three"))
    assert counted is not None and msgspec.json.decode(counted.body) == {"input_tokens": 3}
    lost = build_entry(msgspec.structs.replace(entry, base_urls=(f"{vertex_url}/v1/projects/p",)))
    refused = await lost.complete(call("hi"))  # Google's own refusal, in OpenAI's shape
    assert refused.status == 404
    assert msgspec.json.decode(refused.body)["error"]["code"] == "NOT_FOUND"
    mine = [g for g in grants(*token_server) if g.get("iss") == service_account]
    assert len(mine) == 2  # one token per backend, reused for its requests
    assert mine[0]["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    assert mine[0]["scope"] == "https://www.googleapis.com/auth/cloud-platform"


def test_vertex_takes_google_clouds_credentials_not_a_key() -> None:
    model = {"id": "c", "provider": "vertex", "base_urls": ["https://x/v1"], "api_key_env": "K"}
    with pytest.raises(CatalogError, match="Google Cloud's credentials"):
        Catalog(msgspec.convert({"models": [model]}, CatalogFile))
    # an Anthropic model may be served by Anthropic and by Vertex AI: the same wire
    mixed = {
        "id": "c",
        "provider": "anthropic",
        "deployments": [
            {"base_url": "https://api.anthropic.com", "api_key_env": "K"},
            {"base_url": "https://us-east5-aiplatform.googleapis.com/v1", "provider": "vertex"},
        ],
    }
    catalog = Catalog(msgspec.convert({"models": [mixed]}, CatalogFile))
    assert [d.provider for d in catalog.models["c"].live_deployments] == ["vertex"]  # K unset
