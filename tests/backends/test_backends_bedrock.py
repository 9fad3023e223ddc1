"""Anthropic's models on Amazon Bedrock as a backend: the fake is first proven to speak Bedrock's
wire as botocore's own `bedrock-runtime` client (boto3's) expects it (Signature V4, the model in
the path, event-stream frames), then the platform's backend talks to it, signing with the
credentials AWS's chain finds in the environment, or with a Bedrock API key."""

import json
from collections.abc import AsyncIterator
from typing import Any

import botocore.session
import msgspec
import pytest
from botocore.exceptions import ClientError

from tests.backends.conftest import AWS_KEYS, KEY_ENV, control, stats
from tests.backends.fake_bedrock import event_frame
from tests.backends.test_backends_openai import call, events, read_stream
from tokenyard.backends.anthropic_clouds import bedrock_events
from tokenyard.backends.anthropic_wire import StreamError
from tokenyard.backends.base import UpstreamBroken
from tokenyard.router.catalog import Catalog, CatalogError, CatalogFile, ModelEntry

MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
ASK = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 8}
ASK |= {"messages": [{"role": "user", "content": "hello #chunks=3"}]}


def client(url: str, secret: str = AWS_KEYS["secret"]) -> Any:
    session = botocore.session.get_session()
    return session.create_client(
        "bedrock-runtime",
        region_name="us-west-2",
        endpoint_url=url,
        aws_access_key_id=AWS_KEYS["access"],
        aws_secret_access_key=secret,
    )


def test_the_fake_speaks_bedrock_as_botocore_does(bedrock_url: str) -> None:
    control(bedrock_url, reset=True)
    bedrock = client(bedrock_url)
    reply = json.loads(bedrock.invoke_model(modelId=MODEL, body=json.dumps(ASK))["body"].read())
    assert reply["content"][0]["text"] == "w0 w1 w2 "
    seen = stats(bedrock_url)
    assert (seen["model"], seen["verb"], seen["auth"], seen["region"]) == (
        MODEL,
        "invoke",
        "sigv4",
        "us-west-2",
    )
    stream = bedrock.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(ASK))
    events = [json.loads(e["chunk"]["bytes"]) for e in stream["body"]]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text == "w0 w1 w2 " and events[-1]["type"] == "message_stop"
    count = bedrock.count_tokens(modelId=MODEL, input={"invokeModel": {"body": json.dumps(ASK)}})
    assert count["inputTokens"] == 2
    with pytest.raises(ClientError) as refused:  # a wrong secret: the signature does not match
        client(bedrock_url, "not/the/secret").invoke_model(modelId=MODEL, body=json.dumps(ASK))
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def bedrock_model(url: str, **own: Any) -> ModelEntry:
    return ModelEntry(
        id="haiku-bedrock",
        provider="bedrock",
        upstream_model=MODEL,
        base_urls=(url,),
        region="us-west-2",
        **own,
    )


async def test_the_backend_signs_each_request_with_the_environments_credentials(
    build_entry: Any, bedrock_url: str, aws_env: None
) -> None:
    control(bedrock_url, reset=True)
    entry = bedrock_model(bedrock_url)
    assert entry.configured  # no key: AWS's credentials, found at the first request
    upstream = build_entry(entry)
    reply = await upstream.complete(call("hi #chunks=2"))
    assert reply.status == 200, reply.body
    body = msgspec.json.decode(reply.body)
    assert body["model"] == "haiku-bedrock" and body["choices"][0]["message"]["content"] == "w0 w1 "
    assert (stats(bedrock_url)["verb"], stats(bedrock_url)["auth"]) == ("invoke", "sigv4")
    chunks = events(await read_stream(upstream, call("hi #chunks=3", stream=True)))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "w0 w1 w2 " and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert stats(bedrock_url)["verb"] == "invoke-with-response-stream"
    counted = await upstream.count_tokens(call("one two three"))
    assert counted is not None and msgspec.json.decode(counted.body) == {"input_tokens": 3}
    with pytest.raises(UpstreamBroken):  # an exception frame mid-stream
        await read_stream(upstream, call("hi #chunks=5 #stream_error=3", stream=True))
    refused = await upstream.complete(call("no #status=400"))  # Bedrock's refusal, OpenAI's shape
    assert refused.status == 400
    assert msgspec.json.decode(refused.body)["error"]["message"] == "refused (#status)"


async def test_a_bedrock_api_key_goes_as_a_bearer_token(
    build_entry: Any, bedrock_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    control(bedrock_url, reset=True)
    monkeypatch.setenv(KEY_ENV, AWS_KEYS["api_key"])
    upstream = build_entry(bedrock_model(bedrock_url, api_key_env=KEY_ENV))
    reply = await upstream.complete(call("hi #chunks=2"))
    assert reply.status == 200 and stats(bedrock_url)["auth"] == "bearer"


async def test_a_corrupted_frame_is_the_streams_error() -> None:
    good = event_frame(b'{"type": "ping"}')
    bad = good[:-1] + bytes([good[-1] ^ 1])  # the message's CRC no longer adds up

    async def chunks() -> AsyncIterator[bytes]:
        yield good
        yield bad

    events = bedrock_events(chunks())
    assert (await anext(events)).data == b'{"type": "ping"}'
    with pytest.raises(StreamError):
        await anext(events)


def test_bedrock_needs_its_region() -> None:
    model = {"id": "c", "provider": "bedrock", "base_urls": ["https://bedrock-runtime.x"]}
    with pytest.raises(CatalogError, match="region"):
        Catalog(msgspec.convert({"models": [model]}, CatalogFile))
