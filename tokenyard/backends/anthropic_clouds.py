"""Where Anthropic's Messages API is served, and how each place takes a request: Anthropic's own
(the model in the body), Google Cloud's Vertex AI and Amazon Bedrock (the model in the path, the
API version in the body, as Anthropic's AnthropicVertex and AnthropicBedrock clients send it).
The body is Anthropic's everywhere; Bedrock streams it in AWS's binary event-stream framing, one
Anthropic event in each frame.
"""

import base64
import json
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import quote

from tokenyard.backends import aws_stream, sse
from tokenyard.backends.anthropic_wire import StreamError

Cloud = Literal["", "vertex", "bedrock"]  # "": Anthropic's own API

PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"
# what Anthropic's count_tokens takes of a Messages request (it refuses the rest, max_tokens too)
COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking")
VERTEX_MODELS = "/publishers/anthropic/models/"
VERSIONS = {"vertex": "vertex-2023-10-16", "bedrock": "bedrock-2023-05-31"}
# a Bedrock stream's exceptions, as Anthropic's error types (status and retry follow from these)
BEDROCK_ERRORS = {
    "throttlingException": "rate_limit_error",
    "serviceUnavailableException": "overloaded_error",
    "modelNotReadyException": "overloaded_error",
    "validationException": "invalid_request_error",
}


def _cloud_body(message: dict[str, Any], cloud: Cloud) -> dict[str, Any]:
    """The body as a cloud takes it: no model (the path names it), its API version; Bedrock
    streams by the path alone and refuses `stream` in the body."""
    dropped = ("model", "stream") if cloud == "bedrock" else ("model",)
    return {k: v for k, v in message.items() if k not in dropped} | {
        "anthropic_version": VERSIONS[cloud]
    }


def messages_request(message: dict[str, Any], cloud: Cloud, model: str) -> tuple[str, bytes]:
    """Where a Messages request goes, and its body."""
    stream = bool(message.get("stream"))
    if cloud == "vertex":
        verb = "streamRawPredict" if stream else "rawPredict"
        return f"{VERTEX_MODELS}{model}:{verb}", json.dumps(_cloud_body(message, cloud)).encode()
    if cloud == "bedrock":
        verb = "invoke-with-response-stream" if stream else "invoke"
        # a model id holds ':' ("…-v1:0"), quoted as AWS's clients quote it (and sign it)
        path = f"/model/{quote(model, safe='')}/{verb}"
        return path, json.dumps(_cloud_body(message, cloud)).encode()
    return PATH, json.dumps({**message, "model": model}).encode()


def count_request(message: dict[str, Any], cloud: Cloud, model: str) -> tuple[str, bytes]:
    """Where a token count goes, and its body."""
    fields = {k: v for k, v in message.items() if k in COUNTED} | {"model": model}
    if cloud == "vertex":
        body = fields | {"anthropic_version": VERSIONS[cloud]}
        return f"{VERTEX_MODELS}count-tokens:rawPredict", json.dumps(body).encode()
    if cloud == "bedrock":  # the whole body it would invoke, base64 (a blob in AWS's JSON)
        invoke = base64.b64encode(json.dumps(_cloud_body(message, cloud)).encode()).decode()
        body = {"input": {"invokeModel": {"body": invoke}}}
        return f"/model/{quote(model, safe='')}/count-tokens", json.dumps(body).encode()
    return COUNT_PATH, json.dumps(fields).encode()


def counted_tokens(reply: dict[str, Any]) -> int:
    """A count's answer: Anthropic's and Vertex's `input_tokens`, Bedrock's `inputTokens`."""
    return int(reply["input_tokens"] if "input_tokens" in reply else reply["inputTokens"])


def stream_events(cloud: Cloud, chunks: AsyncIterator[bytes]) -> AsyncIterator[sse.Event]:
    """A stream's Anthropic events: server-sent events, or Bedrock's binary frames."""
    return bedrock_events(chunks) if cloud == "bedrock" else sse.events(chunks)


async def bedrock_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[sse.Event]:
    """AWS event-stream frames → the Anthropic events they carry, base64 in a `chunk` event's
    `bytes`; an exception frame is the stream's error, as Anthropic's `error` event would be."""
    try:
        async for frame in aws_stream.frames(chunks):
            if frame.kind == "event" and "bytes" in frame.payload:
                yield sse.Event("", base64.b64decode(frame.payload["bytes"]))
            elif frame.kind in ("exception", "error"):
                error_type = BEDROCK_ERRORS.get(frame.name, "api_error")
                raise StreamError({"type": error_type, "message": frame.message})
    except aws_stream.FrameError as exc:
        raise StreamError({"type": "api_error", "message": str(exc)}) from exc
