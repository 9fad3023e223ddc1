"""Amazon Bedrock's Converse API as a backend, for any model Bedrock serves (translation in
converse_wire.py, through Anthropic's shapes), run by translated.py. Signed with AWS's credentials
(aws_auth.py), or a Bedrock API key."""

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from tokenyard.backends import converse_wire
from tokenyard.backends.anthropic_wire import ChunkWriter, chat_chunks, chat_reply, error_reply
from tokenyard.backends.deployments import Deployment
from tokenyard.backends.translated import Asked


class ConverseWire:
    counts = False  # Bedrock counts only some models' tokens: the gateway's estimate answers

    def __init__(self, adaptive: bool = False) -> None:
        self.adaptive = adaptive  # a Claude model that thinks adaptively (as AnthropicWire's)

    def translate(self, body: dict[str, Any]) -> dict[str, Any]:
        return converse_wire.converse_request(body, self.adaptive)

    def request(self, native: dict[str, Any], at: Deployment, stream: bool) -> tuple[str, bytes]:
        # a model id holds ':' ("…-v1:0"), quoted as AWS's clients quote it (and sign it)
        verb = "converse-stream" if stream else "converse"
        return f"/model/{quote(at.model, safe='')}/{verb}", json.dumps(native).encode()

    def count_request(self, native: dict[str, Any], at: Deployment) -> tuple[str, bytes]:
        raise NotImplementedError  # never asked: `counts` is false

    def counted(self, reply: Any) -> int:
        raise NotImplementedError

    def reply(self, reply: Any, asked: Asked) -> tuple[int, bytes]:
        message = converse_wire.anthropic_message(reply)
        return 200, json.dumps(chat_reply(message, asked.model, asked.json_answer)).encode()

    def error(self, status: int, raw: bytes) -> tuple[int, bytes]:
        return error_reply(status, raw)  # Bedrock's `{"message"}`, as for Anthropic's models

    def chunks(
        self, at: Deployment, raw: AsyncIterator[bytes], asked: Asked
    ) -> AsyncIterator[bytes]:
        writer = ChunkWriter(asked.model, asked.include_usage, asked.json_answer)
        return chat_chunks(converse_wire.events(raw), writer)
