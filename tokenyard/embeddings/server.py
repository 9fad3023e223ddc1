"""The embeddings server: OpenAI's `POST /v1/embeddings` over one sentence-embedding model, with
dynamic batching (embeddings/batcher.py), reranking by the same model (`/v1/rerank` and
`/v2/rerank`: embeddings/rerank.py), plus the `/health` and `/load` the gateway's engine backend
polls (it treats this server as one more self-hosted replica: docs/engine-protocol.md).

Inputs: a string, a list of strings, a token-id list or a list of them (the model's own WordPiece
ids), at most MAX_INPUTS; `encoding_format` float or base64 (little-endian float32, as OpenAI's);
`dimensions` only at the model's own size (MiniLM is not trained to be shortened). The reply's
`model` is the one the request named (the gateway names its catalog id); `timings` says the queue
and compute seconds the request took, which billing prices a self-hosted model by.
"""

import base64
import logging
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException

from tokenyard.core.errors import (
    GatewayError,
    gateway_error_handler,
    http_error_handler,
    internal_error_handler,
)
from tokenyard.core.openapi import json_body, openapi_config
from tokenyard.embeddings import rerank
from tokenyard.embeddings.batcher import Batcher
from tokenyard.embeddings.model import MiniLM

log = logging.getLogger("tokenyard.embeddings")
MAX_INPUTS = 2048  # OpenAI's limit per request
_S = TypeVar("_S", bound=msgspec.Struct)


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    model: str
    # a string, a list of strings, a token-id list or a list of them (checked in `inputs`)
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None


def _bad(message: str, param: str | None = "input") -> GatewayError:
    return GatewayError(400, message, param=param)


def _decoded(raw: bytes, struct: type[_S]) -> _S:
    try:
        return msgspec.json.decode(raw, type=struct)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _bad(str(exc), None) from None


def _is_ids(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, int) and not isinstance(i, bool) for i in items)


def inputs(raw: str | list[Any], model: MiniLM) -> list[list[int]]:
    """The request's inputs as token-id lists, checked."""
    if isinstance(raw, str) or _is_ids(raw):
        raw = [raw]
    if not raw:
        raise _bad("input must not be empty")
    if len(raw) > MAX_INPUTS:
        raise _bad(f"input holds at most {MAX_INPUTS} items")
    texts = [item for item in raw if isinstance(item, str)]
    if texts and len(texts) != len(raw):
        raise _bad("input mixes strings and token ids")
    if texts:
        if any(not t for t in texts):
            raise _bad("input must not contain empty strings")
        return model.tokenize(texts)
    for item in raw:
        if not isinstance(item, list) or not _is_ids(item):
            raise _bad(
                "input must be a string, a list of strings, a token-id list or a list of them"
            )
        if min(item) < 0 or max(item) >= model.vocab_size:
            raise _bad(f"token ids must be between 0 and {model.vocab_size - 1}")
    return raw


def _encoded(vector: Any, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()


def create_app(model: MiniLM, max_batch: int, max_wait_s: float, name: str) -> Litestar:
    batcher = Batcher(model.encode, max_batch, max_wait_s)

    @post("/v1/embeddings", status_code=200, operation_class=json_body(EmbeddingsRequest))
    async def embeddings(request: Request) -> Response[bytes]:
        req = _decoded(await request.body(), EmbeddingsRequest)
        if req.dimensions is not None and req.dimensions != model.dimensions:
            raise _bad(
                f"this model's embeddings have {model.dimensions} dimensions and cannot be "
                "shortened",
                "dimensions",
            )
        result = await batcher.embed(inputs(req.input, model))
        tokens = sum(result.encoded.tokens)
        body = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
                for i, v in enumerate(result.encoded.vectors)
            ],
            "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "timings": {"queue": result.queue_s, "compute": result.compute_s},
        }
        return Response(msgspec.json.encode(body), media_type="application/json")

    @post(
        ["/v1/rerank", "/v2/rerank"],
        status_code=200,
        operation_class=json_body(rerank.RerankRequest),
    )
    async def rerank_documents(request: Request) -> Response[bytes]:
        req = _decoded(await request.body(), rerank.RerankRequest)
        docs = rerank.texts(req)
        ids = rerank.inputs(req, model.tokenize([req.query, *docs]))
        result = await batcher.embed(ids)
        body = rerank.reply(req, docs, result)
        return Response(msgspec.json.encode(body), media_type="application/json")

    @get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @get("/load")
    async def load() -> dict[str, Any]:
        """The engine's load shape (no KV cache here): what the gateway's backend polls."""
        return {
            "model": name,
            "block_size": 0,
            "total_blocks": 0,
            "free_blocks": 0,
            "waiting": batcher.waiting,
            "max_model_len": 0,
            "batches": batcher.batches,
        }

    async def startup() -> None:
        batcher.start()

    async def shutdown() -> None:
        await batcher.stop()

    return Litestar(
        route_handlers=[embeddings, rerank_documents, health, load],
        on_startup=[startup],
        on_shutdown=[shutdown],
        exception_handlers={
            GatewayError: gateway_error_handler,
            HTTPException: http_error_handler,
            Exception: internal_error_handler,
        },
        openapi_config=openapi_config("tokenyard embeddings", bearer=False),
    )
