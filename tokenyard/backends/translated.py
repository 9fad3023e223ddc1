"""A commercial API with a wire of its own (Anthropic's Messages, Google's generateContent) as a
backend: OpenAI chat requests in, translated for one of the model's deployments, its reply or
stream translated back to OpenAI's shapes. What differs per API is its `Wire`; how attempts move
between deployments, stream up to the first token within the timeout, and are retried, is here.
Such APIs have no text completions: /v1/completions is a 400."""

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from tokenyard.backends.anthropic_wire import answers_in_json
from tokenyard.backends.api import Opened, Reply
from tokenyard.backends.base import (
    BufferedStream,
    ModelInfo,
    StreamRefusal,
    UpstreamBroken,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    counted,
    serves_only,
)
from tokenyard.backends.deployments import DeployedUpstream, Deployment, Deployments
from tokenyard.backends.retry import Retryable


@dataclass(frozen=True)
class Asked:
    """What the client's request asked of the answer's shape, which a wire's translation of the
    reply needs beside the reply itself."""

    model: str  # the catalog's name, which the answer carries
    include_usage: bool = False  # a stream's usage chunk
    json_answer: bool = False  # a JSON answer (response_format), where a tool carries it


class Wire(Protocol):
    """One API's requests and replies, against OpenAI's chat ones."""

    def translate(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI chat body → the API's own request, without the model (each deployment
        names its own); a GatewayError where the API cannot honour it."""
        ...

    def request(self, native: dict[str, Any], at: Deployment, stream: bool) -> tuple[str, bytes]:
        """The path (below the deployment's base URL) and body of a generation."""
        ...

    # whether the API counts a request's input tokens (if not, the gateway estimates them)
    counts: bool

    def count_request(self, native: dict[str, Any], at: Deployment) -> tuple[str, bytes]:
        """The path and body of a count of the request's input tokens."""
        ...

    def counted(self, reply: Any) -> int: ...

    def reply(self, reply: Any, asked: Asked) -> tuple[int, bytes]:
        """A 200 reply → (status, OpenAI body): a refusal where the API says so in a 200."""
        ...

    def error(self, status: int, raw: bytes) -> tuple[int, bytes]:
        """A refusal → (status, OpenAI error body)."""
        ...

    def chunks(
        self, at: Deployment, raw: AsyncIterator[bytes], asked: Asked
    ) -> AsyncIterator[bytes]:
        """A 200 stream's bytes → OpenAI chunk events; StreamRefusal for a refusal within."""
        ...


async def _translated(first: bytes, rest: AsyncIterator[bytes], name: str) -> AsyncIterator[bytes]:
    yield first
    try:
        async for chunk in rest:
            yield chunk
    except (StreamRefusal, json.JSONDecodeError) as exc:
        raise UpstreamBroken(f"{name}: {exc}") from exc


class TranslatedUpstream(DeployedUpstream):
    def __init__(self, info: ModelInfo, deployments: Deployments, wire: Wire) -> None:
        super().__init__(info, deployments)
        self.wire = wire

    def _prepare(self, call: UpstreamCall) -> tuple[dict[str, Any], Asked]:
        if call.path != "/v1/chat/completions":
            raise serves_only(self.info.name, "/v1/chat/completions")
        body: dict[str, Any] = json.loads(call.body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        asked = Asked(self.info.name, include_usage, answers_in_json(body))
        return self.wire.translate(body), asked

    def ping(self, at: Deployment, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        return self.wire.request(self.wire.translate(body), at, stream=False)  # chat only

    def refusal(self, status: int, raw: bytes) -> tuple[int, bytes]:
        return self.wire.error(status, raw)

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        native, _ = self._prepare(call)
        if not self.wire.counts:
            return None

        async def send(at: Deployment) -> Reply:
            return await at.api.post(*self.wire.count_request(native, at))

        response = await self.deployments.reply(send, call)
        if response.status == 200:
            return counted(self.wire.counted(response.json()))
        return self.refused(response.status, response.body)

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        native, asked = self._prepare(call)

        async def send(at: Deployment) -> Reply:
            return await at.api.post(*self.wire.request(native, at, stream=False))

        response = await self.deployments.reply(send, call)
        if response.status != 200:
            return self.refused(response.status, response.body)
        return UpstreamReply(*self.wire.reply(response.json(), asked), "application/json")

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        native, asked = self._prepare(call)
        wire, name = self.wire, self.info.name

        async def send(
            at: Deployment,
        ) -> tuple[Opened, bytes, AsyncIterator[bytes]] | BufferedStream:
            opened = await at.api.open(*wire.request(native, at, stream=True))
            if isinstance(opened, Reply):
                return BufferedStream(*wire.error(opened.status, opened.body))
            chunks = wire.chunks(at, opened.chunks(), asked)
            try:  # a refusal in place of the first event is the answer, retried if 429/5xx
                async with asyncio.timeout(at.api.policy.first_token_timeout_s):
                    first = await anext(chunks)
            except StreamRefusal as exc:
                await opened.aclose()
                if exc.status == 429 or exc.status >= 500:
                    raise Retryable(str(exc), exc.status) from exc
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
        return deployments.stream(at, _translated(first, chunks, name), opened.aclose)
