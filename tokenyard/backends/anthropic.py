"""Anthropic's Messages API as a backend (translation in anthropic_wire.py; Anthropic's own API,
Vertex AI's and Bedrock's in anthropic_clouds.py), run by translated.py."""

import json
from collections.abc import AsyncIterator
from typing import Any

from tokenyard.backends.anthropic_clouds import (
    count_request,
    counted_tokens,
    messages_request,
    stream_events,
)
from tokenyard.backends.anthropic_wire import ChunkWriter, chat_chunks, chat_reply, error_reply
from tokenyard.backends.anthropic_wire import messages_request as translate
from tokenyard.backends.deployments import Deployment
from tokenyard.backends.translated import Asked

VERSION = "2023-06-01"


def headers(api_key: str) -> dict[str, str]:
    return {"x-api-key": api_key, "anthropic-version": VERSION}


class AnthropicWire:
    counts = True

    def __init__(self, adaptive: bool = False) -> None:
        self.adaptive = adaptive  # the model thinks adaptively (catalog: thinking = "adaptive")

    def translate(self, body: dict[str, Any]) -> dict[str, Any]:
        # the model's name is each deployment's own, set as it is sent
        return translate(body, "", self.adaptive)

    def request(self, native: dict[str, Any], at: Deployment, stream: bool) -> tuple[str, bytes]:
        return messages_request(native, at.cloud, at.model)  # `native` says whether it streams

    def count_request(self, native: dict[str, Any], at: Deployment) -> tuple[str, bytes]:
        return count_request(native, at.cloud, at.model)

    def counted(self, reply: Any) -> int:
        return counted_tokens(reply)

    def reply(self, reply: Any, asked: Asked) -> tuple[int, bytes]:
        return 200, json.dumps(chat_reply(reply, asked.model, asked.json_answer)).encode()

    def error(self, status: int, raw: bytes) -> tuple[int, bytes]:
        return error_reply(status, raw)

    def chunks(
        self, at: Deployment, raw: AsyncIterator[bytes], asked: Asked
    ) -> AsyncIterator[bytes]:
        writer = ChunkWriter(asked.model, asked.include_usage, asked.json_answer)
        return chat_chunks(stream_events(at.cloud, raw), writer)
