"""Google's Gemini API as a backend (translation in gemini_wire.py), run by translated.py: Google
AI Studio with an API key (`x-goog-api-key`), or Vertex AI with Google Cloud's credentials (the
model under /publishers/google/models/); and Gemini's embedding models."""

import json
from collections.abc import AsyncIterator
from typing import Any

from tokenyard.backends import gemini_wire, sse
from tokenyard.backends.api import Reply
from tokenyard.backends.base import UpstreamCall, UpstreamReply, UpstreamStream, serves_only
from tokenyard.backends.deployments import DeployedUpstream, Deployment
from tokenyard.backends.translated import Asked
from tokenyard.core.errors import GatewayError


def headers(api_key: str) -> dict[str, str]:
    return {"x-goog-api-key": api_key}


def _cloud(at: Deployment) -> gemini_wire.Cloud:
    return "vertex" if at.cloud == "vertex" else ""


class GeminiWire:
    counts = True

    def translate(self, body: dict[str, Any]) -> dict[str, Any]:
        return gemini_wire.generate_request(body)

    def request(self, native: dict[str, Any], at: Deployment, stream: bool) -> tuple[str, bytes]:
        verb = "streamGenerateContent" if stream else "generateContent"
        return gemini_wire.path(_cloud(at), at.model, verb), json.dumps(native).encode()

    def count_request(self, native: dict[str, Any], at: Deployment) -> tuple[str, bytes]:
        body = gemini_wire.count_request(native, _cloud(at), at.model)
        return gemini_wire.path(_cloud(at), at.model, "countTokens"), json.dumps(body).encode()

    def counted(self, reply: Any) -> int:
        return int(reply["totalTokens"])

    def reply(self, reply: Any, asked: Asked) -> tuple[int, bytes]:
        refused = gemini_wire.blocked(reply)
        if refused is not None:
            return refused
        return 200, json.dumps(gemini_wire.chat_reply(reply, asked.model)).encode()

    def error(self, status: int, raw: bytes) -> tuple[int, bytes]:
        return gemini_wire.error_reply(status, raw)

    def chunks(
        self, at: Deployment, raw: AsyncIterator[bytes], asked: Asked
    ) -> AsyncIterator[bytes]:
        # Gemini answers in JSON by itself (responseJsonSchema): no answer tool to unwrap
        writer = gemini_wire.ChunkWriter(asked.model, asked.include_usage)
        return gemini_wire.chat_chunks(sse.events(raw), writer)


class GeminiEmbeddings(DeployedUpstream):
    """Gemini's embedding models (gemini-embedding-001, text-embedding-005): OpenAI's
    /v1/embeddings in, AI Studio's batchEmbedContents or Vertex AI's predict out."""

    def ping(self, at: Deployment, path: str, body: dict[str, Any]) -> tuple[str, bytes]:
        where, asked = gemini_wire.embed_request(body, _cloud(at), at.model)
        return where, json.dumps(asked).encode()

    def refusal(self, status: int, raw: bytes) -> tuple[int, bytes]:
        return gemini_wire.error_reply(status, raw)

    async def complete(self, call: UpstreamCall) -> UpstreamReply:
        if call.path != "/v1/embeddings":
            raise serves_only(self.info.name, "/v1/embeddings")
        body: dict[str, Any] = json.loads(call.body)
        gemini_wire.embedding_inputs(body)  # refused before anything is sent

        async def send(at: Deployment) -> Reply:
            return await at.api.post(*self.ping(at, call.path, body))

        response = await self.deployments.reply(send, call)
        if response.status != 200:
            return self.refused(response.status, response.body)
        reply = gemini_wire.embeddings_reply(response.json(), body, self.info.name)
        return UpstreamReply(200, json.dumps(reply).encode(), "application/json")

    async def open_stream(self, call: UpstreamCall) -> UpstreamStream:
        raise GatewayError(400, "embeddings are not streamed", param="stream")

    async def count_tokens(self, call: UpstreamCall) -> UpstreamReply | None:
        return None
