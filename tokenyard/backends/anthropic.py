"""Anthropic's Messages API as a backend: OpenAI chat requests in, OpenAI replies and chunks out
(translation in anthropic_wire.py; Anthropic's own API, Vertex AI's and Bedrock's in
anthropic_clouds.py). Anthropic has no text completions: /v1/completions is a 400."""

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from tokenyard.backends.anthropic_clouds import (
    count_request,
    counted_tokens,
    messages_request,
    stream_events,
)
from tokenyard.backends.anthropic_wire import (
    ChunkWriter,
    StreamError,
    chat_chunks,
    chat_reply,
    error_reply,
)
from tokenyard.backends.anthropic_wire import messages_request as translate
from tokenyard.backends.api import Opened, Reply
from tokenyard.backends.base import (
    BufferedStream,
    LiveStream,
    ModelInfo,
    UpstreamBroken,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    counted,
)
from tokenyard.backends.deployments import Deployment, Deployments
from tokenyard.backends.retry import Retryable
from tokenyard.core.errors import GatewayError

VERSION = "2023-06-01"


def headers(api_key: str) -> dict[str, str]:
    return {"x-api-key": api_key, "anthropic-version": VERSION}


async def _translated(first: bytes, rest: AsyncIterator[bytes], name: str) -> AsyncIterator[bytes]:
    yield first
    try:
        async for chunk in rest:
            yield chunk
    except (StreamError, json.JSONDecodeError) as exc:
        raise UpstreamBroken(f"{name}: {exc}") from exc


class AnthropicUpstream:
    def __init__(self, info: ModelInfo, deployments: Deployments) -> None:
        self.info = info
        self.deployments = deployments

    def _prepare(self, call: UpstreamCall) -> tuple[dict[str, Any], bool]:
        if call.path != "/v1/chat/completions":
            raise GatewayError(
                400,
                f"model {self.info.name!r} serves only /v1/chat/completions",
                code="unsupported_endpoint",
                param="model",
            )
        body: dict[str, Any] = json.loads(call.body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        # the model's name is each deployment's own, set as it is sent
        return translate(body, ""), include_usage

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        message, _ = self._prepare(call)

        async def send(at: Deployment) -> Reply:
            return await at.api.post(*count_request(message, at.cloud, at.model))

        response = await self.deployments.reply(send, call)
        if response.status == 200:
            return counted(counted_tokens(response.json()))
        return UpstreamReply(*error_reply(response.status, response.body), "application/json")

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        message, _ = self._prepare(call)

        async def send(at: Deployment) -> Reply:
            return await at.api.post(*messages_request(message, at.cloud, at.model))

        response = await self.deployments.reply(send, call)
        if response.status == 200:
            reply = chat_reply(response.json(), self.info.name)
            return UpstreamReply(200, json.dumps(reply).encode(), "application/json")
        status, content = error_reply(response.status, response.body)
        return UpstreamReply(status, content, "application/json")

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        message, include_usage = self._prepare(call)

        async def send(
            at: Deployment,
        ) -> tuple[Opened, bytes, AsyncIterator[bytes]] | BufferedStream:
            opened = await at.api.open(*messages_request(message, at.cloud, at.model))
            if isinstance(opened, Reply):
                return BufferedStream(*error_reply(opened.status, opened.body))
            writer = ChunkWriter(self.info.name, include_usage)
            chunks = chat_chunks(stream_events(at.cloud, opened.chunks()), writer)
            try:  # an `error` event in place of message_start is a refusal, retried if 429/5xx
                async with asyncio.timeout(at.api.policy.first_token_timeout_s):
                    first = await anext(chunks)
            except StreamError as exc:
                await opened.aclose()
                if exc.status == 429 or exc.status >= 500:
                    raise Retryable(f"stream {exc.kind}", exc.status) from exc
                return BufferedStream(exc.status, exc.body)
            except (TimeoutError, UpstreamBroken, StopAsyncIteration) as exc:
                await opened.aclose()
                raise Retryable(f"no first event: {exc!r}") from exc
            return opened, first, chunks

        deployments = self.deployments
        at, result = await deployments.run(send, call)
        if isinstance(result, BufferedStream):
            deployments.release(at)
            return result
        opened, first, chunks = result
        return LiveStream(
            _translated(first, chunks, self.info.name),
            deployments.closer(at, opened.aclose),
            lambda: deployments.broken(at),
        )

    async def refresh(self) -> None:
        await self.deployments.refresh()

    async def aclose(self) -> None:
        await self.deployments.aclose()
