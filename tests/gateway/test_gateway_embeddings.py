"""POST /v1/embeddings end to end: the official OpenAI SDK → the gateway → the real embeddings
server (`tokenyard embeddings`, all-MiniLM-L6-v2), with quotas, settling and the usage record."""

import concurrent.futures
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import msgspec
import numpy as np
import openai
import pytest
import redis as redis_sync
import sqlmodel

from tests import SUITE_ENV
from tests.fuzzing import fuzz
from tests.gateway.conftest import (
    HERE,
    MODEL,
    TOKENYARD,
    Gateway,
    Process,
    day_tokens,
    free_port,
    reservations,
    wait_until,
)
from tests.openai_spec import problems
from tokenyard.billing.models import UsageRecord
from tokenyard.core.db import get_engine

EMBED = "all-minilm-l6-v2"
TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew by four percent."]


@pytest.fixture(scope="module")
def embeddings_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("embeddings") / "embeddings.log"
    # a long batching window, so concurrent requests surely meet in one batch
    command = [*TOKENYARD, "embeddings", "--port", str(port), "--max-wait-ms", "100"]
    proc = Process(command, dict(SUITE_ENV), log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health").status_code == 200, 120, "embeddings server")
    yield url
    proc.stop()


def _own_stores(base_env: dict[str, str], data_dir: Path) -> dict[str, str]:
    """A database and a Redis db of this module's own: the session's gateway, whose catalog has no
    embedding model, shares a database with any gateway started on base_env, and its batch worker
    would claim this module's batch lines and answer them 404 (a deployment's gateways share one
    catalog; these two deliberately do not)."""
    own = data_dir / "embeddings"
    own.mkdir(exist_ok=True)
    return {
        "TOKENYARD_DATA_DIR": str(own),
        "TOKENYARD_DATABASE_URL": f"sqlite:///{own}/tokenyard.db",
        "TOKENYARD_REDIS_URL": base_env["TOKENYARD_REDIS_URL"] + "/1",
    }


@pytest.fixture(scope="module")
def sql(base_env: dict[str, str], data_dir: Path) -> Any:
    """This module's database (teams made by `team` go there too)."""
    return get_engine(_own_stores(base_env, data_dir)["TOKENYARD_DATABASE_URL"])


def _embedding_gateway(
    embeddings_server: str, upstream: str, base_env: dict[str, str], data_dir: Path, **more: str
) -> Gateway:
    env = {
        **base_env,
        **_own_stores(base_env, data_dir),
        "TOKENYARD_CATALOG": str(HERE / "embeddings_catalog.toml"),
        "TOKENYARD_ENGINE_URLS": f"{MODEL}={upstream},{EMBED}={embeddings_server}",
        **more,
    }
    gw = Gateway(env, data_dir / f"gateway-embeddings{len(more)}.log")
    wait_until(
        lambda: httpx.get(gw.url + "/ready").json()["models"].get(EMBED), 30, "embeddings ready"
    )
    return gw


@pytest.fixture(scope="module")
def embed_gateway(
    embeddings_server: str, upstream: str, base_env: dict[str, str], data_dir: Path
) -> Iterator[Any]:
    gw = _embedding_gateway(embeddings_server, upstream, base_env, data_dir)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers' own encode of the same model: what the vectors must match."""
    from sentence_transformers import SentenceTransformer

    from tokenyard.core.minilm import minilm_dir

    return SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)


def test_sdk_embeddings_match_sentence_transformers(
    embed_gateway: Any, team: Any, reference: Any, redis_server: Any, sql: Any
) -> None:
    name, key = team()
    client = embed_gateway.client(key)
    # the SDK asks for base64 by default and decodes it itself
    got = client.embeddings.create(model=EMBED, input=TEXTS)
    assert got.model == EMBED and [d.index for d in got.data] == [0, 1]
    assert client.models.retrieve(EMBED).model_extra["kind"] == "embedding"
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == (2, 384)
    expected = reference.encode(TEXTS)
    assert np.abs(vectors - expected).max() < 1e-4
    tokens = sum(len(reference.tokenizer.tokenize(t)) for t in TEXTS)
    assert got.usage.prompt_tokens == tokens == got.usage.total_tokens

    # the raw reply as OpenAI's OpenAPI document describes it (which knows float vectors only)
    raw = client.embeddings.with_raw_response.create(
        model=EMBED, input=TEXTS, dimensions=384, encoding_format="float"
    )
    assert problems("CreateEmbeddingResponse", raw.http_response.json()) == []

    floats = client.embeddings.create(model=EMBED, input=TEXTS[0], encoding_format="float")
    assert np.abs(np.array(floats.data[0].embedding) - expected[0]).max() < 1e-4
    # token ids (the model's own WordPiece ids) embed as the text they spell
    ids = reference.tokenizer(TEXTS[1], add_special_tokens=False)["input_ids"]
    by_ids = client.embeddings.create(model=EMBED, input=[ids], encoding_format="float")
    assert np.abs(np.array(by_ids.data[0].embedding) - expected[1]).max() < 1e-4
    assert by_ids.usage.prompt_tokens == len(ids)

    # settled from the server's usage: the reservation gone, the day's tokens the real count
    r = redis_sync.Redis.from_url(redis_server.url + "/1")  # the module's own Redis db
    wait_until(lambda: reservations(r, name)["leases"] == 0, 5, "leases released")
    used = 2 * tokens + floats.usage.prompt_tokens + by_ids.usage.prompt_tokens
    assert day_tokens(r, name) == used

    def records() -> list[UsageRecord]:
        with sqlmodel.Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.team == name)
            return list(session.exec(query))

    wait_until(lambda: len(records()) == 4, 10, "four usage records")
    for record in records():
        assert record.model == EMBED and record.status == 200 and record.completion_tokens == 0
        assert record.cost_usd > 0  # its compute time at the catalog's $/hour
    assert sum(record.prompt_tokens for record in records()) == used
    # the team's /v1/usage (billing's daily rollups, which the dashboard draws) counts them too
    headers = {"authorization": f"Bearer {key}"}
    usage = httpx.get(embed_gateway.url + "/v1/usage", headers=headers).json()
    assert usage["models"][EMBED]["requests"] == 4
    assert usage["models"][EMBED]["prompt_tokens"] == used


def test_dimensions_and_bad_input_are_openai_errors(embed_gateway: Any, team: Any) -> None:
    _, key = team()
    client = embed_gateway.client(key)
    assert len(client.embeddings.create(model=EMBED, input="x", dimensions=384).data) == 1
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"input": "x", "dimensions": 64}, "dimensions"),  # MiniLM is not shortened
        ({"input": []}, "input"),
        ({"input": [""]}, "input"),
        ({"input": [[1, 2], "text"]}, "input"),
        ({"input": [[10**9]]}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": ["x"] * 2049}, "input"),
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(model=EMBED, **body)
        assert err.value.body["param"] == param, body
    # an embedding model does not chat, nor a chat model embed: OpenAI's 404 for both
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL, input="hi")


def test_token_quota_refuses_and_releases(embed_gateway: Any, team: Any, redis_server: Any) -> None:
    name, key = team(tpm=50)
    client = embed_gateway.client(key)
    with pytest.raises(openai.RateLimitError) as err:
        client.embeddings.create(model=EMBED, input="word " * 400)
    assert err.value.response.headers["x-tokenyard-limit"] == "tokens_per_minute"
    assert reservations(redis_server.client(), name)["leases"] == 0
    assert client.embeddings.create(model=EMBED, input="short").usage.prompt_tokens == 1


def test_concurrent_requests_share_batches(embeddings_server: str) -> None:
    before = httpx.get(embeddings_server + "/load").json()["batches"]
    body = {"model": EMBED, "input": "one sentence", "encoding_format": "float"}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(
                lambda _: httpx.post(embeddings_server + "/v1/embeddings", json=body), range(8)
            )
        )
    assert all(r.status_code == 200 for r in replies)
    vectors = [r.json()["data"][0]["embedding"] for r in replies]
    # equal up to float rounding (a batch's shape changes the matmul's summation order)
    assert np.abs(np.array(vectors) - vectors[0]).max() < 1e-5
    batches = httpx.get(embeddings_server + "/load").json()["batches"] - before
    assert 1 <= batches < 8, batches


def test_batch_lines_of_embeddings(embed_gateway: Any, team: Any, sql: Any) -> None:
    name, key = team()
    client = embed_gateway.client(key)
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": EMBED, "input": text, "encoding_format": "float"},
        }
        for i, text in enumerate(TEXTS)
    ]
    uploaded = client.files.create(
        file=("in.jsonl", b"".join(msgspec.json.encode(x) + b"\n" for x in lines)), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    wait_until(
        lambda: client.batches.retrieve(batch.id).status == "completed", 60, "the batch to finish"
    )
    done = client.batches.retrieve(batch.id)
    output = client.files.content(done.output_file_id).content.splitlines()
    bodies = {o["custom_id"]: o["response"]["body"] for o in map(msgspec.json.decode, output)}
    assert sorted(bodies) == ["e0", "e1"]
    assert all(len(b["data"][0]["embedding"]) == 384 for b in bodies.values())

    def records() -> list[UsageRecord]:
        with sqlmodel.Session(sql) as session:
            return list(session.exec(sqlmodel.select(UsageRecord).where(UsageRecord.team == name)))

    wait_until(lambda: len(records()) == 2, 10, "the batch's usage records")
    assert {(r.tier, r.model) for r in records()} == {("batch", EMBED)}

    # a corpus reranked at the batch tier: the same lines with /v1/rerank
    ranking = {"url": "/v1/rerank", "method": "POST", "custom_id": "r0"}
    ranking["body"] = {"model": EMBED, "query": "a cat on a mat", "documents": TEXTS[::-1]}
    uploaded = client.files.create(
        file=("rerank.jsonl", msgspec.json.encode(ranking) + b"\n"), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/rerank",  # type: ignore[arg-type]
        completion_window="24h",
    )
    wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 60, "reranked")
    done = client.batches.retrieve(batch.id)
    (line,) = client.files.content(done.output_file_id).content.splitlines()
    results = msgspec.json.decode(line)["response"]["body"]["results"]
    assert [r["index"] for r in results] == [1, 0]  # the cat sentence first


def test_fuzz_the_embeddings_server(embeddings_server: str) -> None:
    """The embeddings server's own routes, drawn from its document: no 5xx, OpenAI's error shape."""
    assert {"POST /v1/embeddings", "POST /v1/rerank", "POST /v2/rerank"} <= set(
        fuzz(embeddings_server, 15)
    )


def test_an_embedding_asked_again_comes_from_the_response_cache(
    embeddings_server: str, upstream: str, base_env: dict[str, str], data_dir: Path, team: Any
) -> None:
    """Embeddings are deterministic: with the response cache on, the same input again is answered
    from Redis, the same vectors."""
    more = {"TOKENYARD_GATEWAY_CACHE_TTL_S": "60"}
    gw = _embedding_gateway(embeddings_server, upstream, base_env, data_dir, **more)
    try:
        client = gw.client(team()[1])
        asked = {"model": EMBED, "input": TEXTS, "encoding_format": "float"}
        first = client.embeddings.with_raw_response.create(**asked)
        again = client.embeddings.with_raw_response.create(**asked)
        assert (first.headers["x-tokenyard-cache"], again.headers["x-tokenyard-cache"]) == (
            "miss",
            "hit",
        )
        vectors = [[d.embedding for d in reply.parse().data] for reply in (first, again)]
        assert vectors[0] == vectors[1]
        # so is a ranking
        ask = {"model": EMBED, "query": "cats", "documents": TEXTS}
        headers = {"authorization": f"Bearer {client.api_key}"}
        ranked = [httpx.post(gw.url + "/v1/rerank", headers=headers, json=ask) for _ in range(2)]
        assert [r.headers["x-tokenyard-cache"] for r in ranked] == ["miss", "hit"]
        assert ranked[0].json()["results"] == ranked[1].json()["results"]
    finally:
        gw.stop()


def test_geminis_embed_content_matches_sentence_transformers(
    embed_gateway: Any, team: Any, reference: Any
) -> None:
    """Google's SDK (batchEmbedContents) and embedContent over REST, on the same model."""
    key = team()[1]
    client = embed_gateway.gemini(key)
    got = client.models.embed_content(model=EMBED, contents=TEXTS)
    vectors = np.array([e.values for e in got.embeddings])  # type: ignore[union-attr]
    assert np.abs(vectors - reference.encode(TEXTS)).max() < 1e-4
    model = client.models.get(model=EMBED)
    assert model.supported_actions == ["embedContent", "batchEmbedContents"]
    one = httpx.post(
        embed_gateway.url + f"/v1beta/models/{EMBED}:embedContent",
        headers={"x-goog-api-key": key},
        json={"content": {"parts": [{"text": TEXTS[1]}]}, "taskType": "RETRIEVAL_DOCUMENT"},
    )
    assert one.status_code == 200, one.text
    values = np.array(one.json()["embedding"]["values"])
    assert np.abs(values - reference.encode(TEXTS[1])).max() < 1e-4
    mixed = httpx.post(
        embed_gateway.url + f"/v1beta/models/{EMBED}:batchEmbedContents",
        headers={"x-goog-api-key": key},
        json={"requests": [{"content": {"parts": [{"inlineData": {"data": "AA=="}}]}}]},
    )
    assert mixed.status_code == 400 and mixed.json()["error"]["status"] == "INVALID_ARGUMENT"


QUERY = "Where do cats like to sleep?"
DOCUMENTS = [
    "Quarterly revenue grew by four percent.",
    "Cats often sleep on warm windowsills in the afternoon.",
    "The train to Lyon leaves at nine.",
    "A kitten naps wherever the sun falls.",
]


def _relevance(reference: Any, query: str, documents: list[str]) -> np.ndarray:
    """Cosine similarity of each document's sentence-transformers embedding to the query's."""
    vectors = reference.encode([query, *documents], normalize_embeddings=True)
    return vectors[1:] @ vectors[0]


def test_cohere_sdks_rerank_through_the_gateway(
    embed_gateway: Any, team: Any, reference: Any, redis_server: Any, sql: Any
) -> None:
    """Cohere's v2 client (/v2/rerank) and v1 client (/v1/rerank) against the embedding model:
    documents ranked by their cosine similarity to the query, as sentence-transformers computes
    it; billed the tokens the model read."""
    name, key = team()
    v2 = cohere.ClientV2(api_key=key, base_url=embed_gateway.url)
    got = v2.rerank(model=EMBED, query=QUERY, documents=DOCUMENTS, top_n=2)
    expected = _relevance(reference, QUERY, DOCUMENTS)
    order = np.argsort(-expected)
    assert [r.index for r in got.results] == order[:2].tolist() and order[0] in (1, 3)
    for result in got.results:
        assert abs(result.relevance_score - expected[result.index]) < 1e-4

    v1 = cohere.Client(api_key=key, base_url=embed_gateway.url)
    every = v1.rerank(
        model=EMBED,
        query=QUERY,
        documents=[{"text": d} for d in DOCUMENTS],
        return_documents=True,
    )
    assert [r.index for r in every.results] == order.tolist()
    assert [r.document.text for r in every.results] == [DOCUMENTS[i] for i in order]

    # settled from the server's usage: the query once and every document, twice
    tokens = sum(len(reference.tokenizer.tokenize(t)) for t in [QUERY, *DOCUMENTS])
    r = redis_sync.Redis.from_url(redis_server.url + "/1")
    wait_until(lambda: reservations(r, name)["leases"] == 0, 5, "leases released")
    assert day_tokens(r, name) == 2 * tokens

    def records() -> list[UsageRecord]:
        with sqlmodel.Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.team == name)
            return list(session.exec(query))

    wait_until(lambda: len(records()) == 2, 10, "two usage records")
    assert {(r.model, r.status, r.prompt_tokens) for r in records()} == {(EMBED, 200, tokens)}

    # Cohere's truncation of long documents: each read up to max_tokens_per_doc tokens
    short = v2.rerank(model=EMBED, query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=2)
    assert short.model_extra["usage"]["prompt_tokens"] == len(
        reference.tokenizer.tokenize(QUERY)
    ) + 2 * len(DOCUMENTS)


def test_bad_rerank_requests_are_openai_errors(
    embed_gateway: Any, team: Any, redis_server: Any
) -> None:
    name, key = team()
    url = embed_gateway.url + "/v1/rerank"
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": EMBED, "query": QUERY, "documents": DOCUMENTS}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"query": ""}, "query"),
        ({"documents": []}, "documents"),
        ({"documents": ["x"] * 1001}, "documents"),
        ({"documents": [7]}, "documents"),
        ({"top_n": 0}, "top_n"),
        ({"max_tokens_per_doc": -1}, "max_tokens_per_doc"),
    ]
    for change, param in cases:
        reply = httpx.post(url, headers=headers, json={**body, **change})
        assert reply.status_code == 400, (change, reply.text)
        error = reply.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param), change
    # a chat model does not rank: the 404 of a model that does not serve the endpoint
    reply = httpx.post(url, headers=headers, json={**body, "model": MODEL})
    assert reply.status_code == 404 and "serves chat and completions only" in reply.text
    assert reservations(redis_server.client(), name)["leases"] == 0
    # the embedding model that ranks says so in its card
    card = httpx.get(embed_gateway.url + f"/v1/models/{EMBED}", headers=headers).json()
    assert card["rerank"] is True and card["kind"] == "embedding"


def test_a_rerank_server_behind_an_openai_style_base_url(
    embeddings_server: str,
    upstream: str,
    base_env: dict[str, str],
    data_dir: Path,
    team: Any,
    tmp_path: Path,
) -> None:
    """A model of kind "rerank" at an OpenAI-style base URL (a vLLM, Infinity or Jina server; here
    the embeddings server's own /v1/rerank) is sent the request with the catalog's key, its reply
    named by the catalog id; an embedding model that does not rank is refused before any call."""
    key_env = f"RERANK_KEY_{uuid.uuid4().hex[:8].upper()}"
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        (HERE / "embeddings_catalog.toml").read_text()
        + f"""
[[models]]
id = "ranker"
provider = "openai"
kind = "rerank"
upstream_model = "{EMBED}"
base_urls = ["{embeddings_server}/v1"]
api_key_env = "{key_env}"
price = {{ input = 1.0 }}

[[models]]
id = "plain-embedder"
provider = "openai"
kind = "embedding"
base_urls = ["{embeddings_server}/v1"]
api_key_env = "{key_env}"
"""
    )
    more = {"TOKENYARD_CATALOG": str(catalog), key_env: "sk-upstream"}
    gw = _embedding_gateway(embeddings_server, upstream, base_env, data_dir, **more)
    try:
        _, key = team()
        client = cohere.ClientV2(api_key=key, base_url=gw.url)
        got = client.rerank(model="ranker", query=QUERY, documents=DOCUMENTS, top_n=1)
        assert got.results[0].index in (1, 3)
        raw = httpx.post(
            gw.url + "/v1/rerank",
            headers={"authorization": f"Bearer {key}"},
            json={"model": "ranker", "query": QUERY, "documents": DOCUMENTS[:1]},
        )
        assert raw.status_code == 200 and raw.json()["model"] == "ranker"
        with pytest.raises(cohere.NotFoundError) as err:
            client.rerank(model="plain-embedder", query=QUERY, documents=DOCUMENTS)
        assert "serves embeddings only" in str(err.value.body)
    finally:
        gw.stop()
