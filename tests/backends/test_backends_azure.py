"""Azure OpenAI as a backend: the fake resource is first proven to speak Azure's wire as the
official `openai` SDK's AzureOpenAI client and Azure's v1 API expect it, then the platform's
backend talks to it: a deployment's URL with its api-version, or the v1 API, the key in
`api-key`, Azure's content-filter annotations and its stream's opening chunk of no choices
passed through, the model renamed to the catalog id."""

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.backends.conftest import control, stats
from tests.backends.fake_azure import SNAPSHOT
from tests.backends.test_backends_openai import call, events, read_stream
from tokenyard.backends.retry import retry_after
from tokenyard.router.catalog import Catalog, CatalogError

VERSION = "2024-10-21"


def test_the_fake_speaks_azure_as_the_sdk_does(azure_url: str) -> None:
    control(azure_url, reset=True)
    client = openai.AzureOpenAI(azure_endpoint=azure_url, api_key="k", api_version=VERSION)
    messages: Any = [{"role": "user", "content": "hello #chunks=3"}]
    reply = client.chat.completions.create(model="my-4o", messages=messages)
    assert reply.model == SNAPSHOT and reply.choices[0].message.content == "w0 w1 w2 "
    filters = (reply.model_extra or {})["prompt_filter_results"][0]["content_filter_results"]
    assert filters["hate"] == {"filtered": False, "severity": "safe"}
    assert (stats(azure_url)["deployment"], stats(azure_url)["api_version"]) == ("my-4o", VERSION)
    chunks = list(client.chat.completions.create(model="my-4o", messages=messages, stream=True))
    assert chunks[0].choices == [] and chunks[0].model == ""  # the prompt's filters
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "
    v1 = openai.OpenAI(base_url=azure_url + "/openai/v1/", api_key="k")
    assert v1.chat.completions.create(model="my-4o", messages=messages).model == SNAPSHOT
    assert stats(azure_url)["api_version"] == ""
    body = {"model": "my-4o", "messages": messages}
    deployment = azure_url + "/openai/deployments/my-4o/chat/completions"
    assert httpx.post(deployment, json=body, headers={"api-key": "k"}).status_code == 404
    unkeyed = httpx.post(deployment, params={"api-version": VERSION}, json=body)
    assert unkeyed.status_code == 401 and unkeyed.json()["error"]["code"] == "401"


async def test_the_backend_calls_a_deployment_and_the_v1_api(make_upstream, azure_url) -> None:
    control(azure_url, reset=True)
    deployment = azure_url + "/openai/deployments/my-4o"
    upstream = make_upstream(
        "azure", [deployment], model_id="azure-4o", own={"api_version": VERSION}
    )
    reply = await upstream.complete(call("hi #chunks=2"))
    assert reply.status == 200
    body = json.loads(reply.body)
    assert body["model"] == "azure-4o" and body["choices"][0]["message"]["content"] == "w0 w1 "
    assert "content_filter_results" in body["choices"][0]  # Azure's annotations pass through
    assert (stats(azure_url)["deployment"], stats(azure_url)["api_version"]) == ("my-4o", VERSION)
    raw = await read_stream(upstream, call("hi #chunks=2", stream=True))
    chunks = events(raw)
    assert chunks[0]["choices"] == [] and "prompt_filter_results" in chunks[0]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[1:]) == "w0 w1 "
    assert all(c["model"] == "azure-4o" for c in chunks)
    completion = await upstream.complete(call("hi #chunks=1", "/v1/completions"))
    assert json.loads(completion.body)["choices"][0]["text"] == "w0 "
    v1 = make_upstream("azure", [azure_url + "/openai/v1"], model_id="azure-v1")
    assert json.loads((await v1.complete(call("hi #chunks=1"))).body)["model"] == "azure-v1"
    assert stats(azure_url)["last_body"]["model"] == "azure-v1"  # the deployment's name
    assert stats(azure_url)["api_version"] == ""


def test_the_catalog_holds_an_azure_deployment_to_its_api_version(tmp_path: Path) -> None:
    head = '[[models]]\nid = "a"\nprovider = "azure"\napi_key_env = "K"\n'
    deployment = 'base_urls = ["https://r.openai.azure.com/openai/deployments/gpt-4o"]\n'
    path = tmp_path / "c.toml"
    for bad in (deployment, deployment + 'api_version = "2024-10-21&x=1"\n'):
        path.write_text(head + bad)
        with pytest.raises(CatalogError):
            Catalog.load(path)
    path.write_text(head + deployment + f'api_version = "{VERSION}"\n')
    entry = Catalog.load(path).models["a"]
    assert entry.wire == "openai"  # fields fare as on OpenAI's API
    path.write_text(head + 'base_urls = ["https://r.openai.azure.com/openai/v1"]\n')
    assert Catalog.load(path).models["a"].api_version == ""


def test_retry_after_takes_the_finer_header_first() -> None:
    assert retry_after({"retry-after-ms": "250", "retry-after": "1"}) == 0.25
    assert retry_after({"retry-after": "2"}) == 2.0
    assert retry_after({"retry-after-ms": "soon", "retry-after": "3"}) == 3.0
    for odd in ({}, {"retry-after": "-1"}, {"retry-after-ms": "nan"}, {"retry-after": "inf"}):
        assert retry_after(odd) is None
