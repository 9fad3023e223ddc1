"""OpenAI's API as a backend: the request passes through (minus the platform's own extension
fields and vLLM-only extras), `model` becomes the provider's name, the reply's `model` the catalog
id."""

from collections.abc import AsyncIterator
from typing import Any

import msgspec
from urllib3 import encode_multipart_formdata

from tokenyard.backends import sse
from tokenyard.backends.api import Opened, Reply
from tokenyard.backends.base import (
    BYTES_PATHS,
    BufferedStream,
    Upload,
    UpstreamCall,
    UpstreamReply,
    UpstreamStream,
    counted,
)
from tokenyard.backends.deployments import DeployedUpstream, Deployment

# the platform's extensions and vLLM's sampling extras: OpenAI rejects unknown fields
DROPPED = frozenset(
    {
        "tier",
        "priority",
        "request_id",
        "tenant",
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "ignore_eos",
        "thinking",  # Anthropic's: reaches an OpenAI model only as {type: disabled} (fields.py)
    }
)

# what OpenAI's input-token count takes of a Responses request (TokenCountsBody in its OpenAPI)
COUNTED = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "conversation",
        "previous_response_id",
        "truncation",
    }
)


def request_body(body: dict[str, Any], model: str) -> bytes:
    out = {**{k: v for k, v in body.items() if k not in DROPPED}, "model": model}
    if isinstance(out.get("messages"), list):
        out["messages"] = [_unthought(m) for m in out["messages"]]
    return msgspec.json.encode(out)


def _unthought(message: Any) -> Any:
    """An assistant turn without the Anthropic thinking blocks a client sends back (LiteLLM's
    field): they are signed for Anthropic's models alone, and OpenAI's API rejects the field."""
    if isinstance(message, dict) and "thinking_blocks" in message:
        return {k: v for k, v in message.items() if k != "thinking_blocks"}
    return message


def form_body(fields: dict[str, Any], model: str, upload: Upload) -> tuple[bytes, str]:
    """A multipart form of the fields (a list: the field repeated, as `include[]`), `model` and
    the file; its content type names the boundary."""
    parts: list[tuple[str, Any]] = [("model", model)]
    for name, value in fields.items():
        if name not in DROPPED and name != "model":
            values = value if isinstance(value, list) else [value]
            parts += [(name, str(v)) for v in values]
    parts.append(("file", (upload.filename, upload.content, upload.content_type)))
    return encode_multipart_formdata(parts)


def renamed(payload: bytes, model: str) -> bytes:
    """A reply or chunk with `model` set to the catalog id (the provider names a dated snapshot);
    in a Responses API event, the response's."""
    try:
        data = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload
    if isinstance(data, dict) and isinstance(data.get("response"), dict):
        data = data["response"]
        if "model" in data:
            data["model"] = model
            return msgspec.json.encode({**msgspec.json.decode(payload), "response": data})
    elif isinstance(data, dict) and "model" in data:
        data["model"] = model
        return msgspec.json.encode(data)
    return payload


async def renamed_events(chunks: AsyncIterator[bytes], model: str) -> AsyncIterator[bytes]:
    async for event in sse.events(chunks):
        if event.data == b"[DONE]":
            yield sse.DONE
        else:
            yield b"data: " + renamed(event.data, model) + b"\n\n"


class OpenAIUpstream(DeployedUpstream):
    """OpenAI's API, or Azure OpenAI's (the same wire at a deployment's URL), at one or more
    deployments."""

    @staticmethod
    def _path(call_path: str, deployment: Deployment) -> str:
        # the base URL ends in /v1 (Azure's: …/openai/v1, or the deployment's own)
        return call_path.removeprefix("/v1") + deployment.query

    def ping(self, at: Deployment, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        return self._path(path, at), request_body(body, at.model)

    @staticmethod
    def _body(
        native: dict[str, Any], call: UpstreamCall, at: Deployment
    ) -> tuple[bytes, str | None]:
        """The request as this deployment takes it: JSON, or a form with the call's file; and
        its content type where it is not JSON."""
        if call.upload is None:
            return request_body(native, at.model), None
        return form_body(native, at.model, call.upload)

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        native = msgspec.json.decode(call.body)

        async def send(at: Deployment) -> Reply:
            return await at.api.post(self._path(call.path, at), *self._body(native, call, at))

        response = await self.deployments.reply(send, call)
        content = response.body
        if response.status == 200:
            content = renamed(content, self.info.name)
        return UpstreamReply(
            response.status,
            content,
            response.headers.get("content-type", "application/json"),
        )

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        """OpenAI counts a Responses request (`/v1/responses/input_tokens`), not a chat one."""
        if call.path != "/v1/responses":
            return None
        native = msgspec.json.decode(call.body)
        counted_fields = {k: v for k, v in native.items() if k in COUNTED}

        async def send(at: Deployment) -> Reply:
            body = msgspec.json.encode(counted_fields | {"model": at.model})
            return await at.api.post("/responses/input_tokens" + at.query, body)

        response = await self.deployments.reply(send, call)
        if response.status == 200:
            return counted(int(response.json()["input_tokens"]))
        return UpstreamReply(response.status, response.body, "application/json")

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        native = msgspec.json.decode(call.body)

        async def send(at: Deployment) -> Opened | Reply:
            return await at.api.open(self._path(call.path, at), *self._body(native, call, at))

        deployments = self.deployments
        at, opened = await deployments.run(send, call)
        if not isinstance(opened, Opened):
            deployments.release(at)
            return BufferedStream(opened.status, opened.body)
        if call.path in BYTES_PATHS:  # audio, as it is made
            kind = opened.response.headers.get("content-type", "application/octet-stream")
            return deployments.stream(at, opened.chunks(), opened.aclose, kind)
        return deployments.stream(
            at, renamed_events(opened.chunks(), self.info.name), opened.aclose
        )
