"""Reranking over the embedding model: a query and documents in, the documents' indexes by relevance
out, in the shape Cohere's, Jina's and vLLM's rerank APIs share (`/v1/rerank`, `/v2/rerank`).

A document's relevance is the cosine similarity of its embedding to the query's, in [-1, 1] (both
vectors are L2-normalised, so it is their dot product). That is what vLLM answers for an embedding
model: a bi-encoder's ranking, not a cross-encoder's, since no cross-encoder ships in a PyPI package
that loads offline. The query and the documents are one request's inputs to the batcher, each read
up to the model's window; `max_tokens_per_doc` (Cohere's) shortens the documents further. Usage
counts the tokens read: the query once, and every document.
"""

from typing import Annotated, Any

import msgspec
import numpy as np

from tokenyard.core.errors import GatewayError
from tokenyard.core.ids import new_id
from tokenyard.embeddings.batcher import Result

MAX_DOCUMENTS = 1000  # Cohere's limit per request


class Document(msgspec.Struct):
    """A document as an object (Cohere's v1 and Jina's form); only its text is read."""

    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    model: str
    query: str
    documents: list[str | Document]
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = False
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None


def texts(req: RerankRequest) -> list[str]:
    """The documents' texts, the request checked."""
    if not req.query:
        raise GatewayError(400, "query must not be empty", param="query")
    if not 1 <= len(req.documents) <= MAX_DOCUMENTS:
        raise GatewayError(
            400, f"documents must hold 1 to {MAX_DOCUMENTS} items", param="documents"
        )
    return [d if isinstance(d, str) else d.text for d in req.documents]


def inputs(req: RerankRequest, ids: list[list[int]]) -> list[list[int]]:
    """The query's and the documents' token ids as the model reads them."""
    if req.max_tokens_per_doc is None:
        return ids
    return [ids[0], *(d[: req.max_tokens_per_doc] for d in ids[1:])]


def reply(req: RerankRequest, docs: list[str], result: Result) -> dict[str, Any]:
    vectors = result.encoded.vectors
    scores = vectors[1:] @ vectors[0]
    order = np.argsort(-scores, kind="stable")[: req.top_n]  # ties keep the documents' order
    results = []
    for i in order.tolist():
        item: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    tokens = sum(result.encoded.tokens)
    return {
        "id": new_id("rerank"),
        "model": req.model,
        "results": results,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "meta": {"billed_units": {"input_tokens": tokens}},  # Cohere's place for the count
        "timings": {"queue": result.queue_s, "compute": result.compute_s},
    }
