"""Every kind of response the gateway emits, in front of the real engine, validated against
OpenAI's published OpenAPI document (tests/openai_spec.py): completions whole and streamed (usage
chunks and logprobs included), responses whole and streamed (every event), models, files, batches
and errors. Extra fields are allowed; a missing required field or a wrong type fails."""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.batch.conftest import jsonl, line
from tests.gateway.conftest import Gateway
from tests.openai_spec import problems
from tokenyard.tenancy import keys, teams

CHAT = [{"role": "user", "content": "Say hello"}]


def conforms(name: str, instance: Any) -> None:
    found = problems(name, instance)
    assert not found, f"{name}: {found[:5]}"


def stream_chunks(reply: httpx.Response) -> list[dict[str, Any]]:
    events = [ln.removeprefix("data: ") for ln in reply.text.splitlines() if ln.startswith("data:")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.fixture(scope="module")
def api(
    engine: str, base_env: dict[str, str], sql: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    env = {**base_env, "TOKENYARD_ENGINE_URLS": f"smollm2={engine}"}
    gw = Gateway(env, tmp_path_factory.mktemp("conformance") / "gateway.log")
    name = "conf-" + uuid.uuid4().hex[:8]
    teams.create_team(sql, name, kv_pages=20)  # 320 tokens in flight: a 429 is one request away
    key = keys.create_key(sql, name).key
    auth = {"authorization": f"Bearer {key}"}
    # the first reply may wait on the engine building its CPU kernels (first use on a machine)
    with httpx.Client(base_url=gw.url, headers=auth, timeout=600) as c:
        yield c
    gw.stop()


def test_chat_completions(api: httpx.Client) -> None:
    body = {"model": "smollm2", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    whole = api.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 2})
    assert whole.status_code == 200
    conforms("CreateChatCompletionResponse", whole.json())
    streamed = api.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}, "logprobs": True},
    )
    chunks = stream_chunks(streamed)
    assert chunks[-1]["usage"] and not chunks[-1]["choices"]  # the usage chunk
    for chunk in chunks:
        conforms("CreateChatCompletionStreamResponse", chunk)


def test_legacy_completions(api: httpx.Client) -> None:
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 4, "logprobs": 2}
    whole = api.post("/v1/completions", json=body)
    assert whole.status_code == 200
    conforms("CreateCompletionResponse", whole.json())
    chunks = stream_chunks(api.post("/v1/completions", json={**body, "stream": True}))
    for chunk in chunks:
        # streamed chunks share the response's schema, whose finish_reason is a string; OpenAI
        # sends null until the last (the document's README notes it)
        for choice in chunk["choices"]:
            choice["finish_reason"] = choice["finish_reason"] or "length"
        conforms("CreateCompletionResponse", chunk)


def test_responses(api: httpx.Client) -> None:
    body = {"model": "smollm2", "input": "Say hello", "max_output_tokens": 4, "temperature": 0}
    whole = api.post("/v1/responses", json={**body, "instructions": "Be brief."})
    assert whole.status_code == 200, whole.text
    conforms("Response", whole.json())
    streamed = api.post("/v1/responses", json={**body, "stream": True})
    events = [
        json.loads(ln.removeprefix("data: "))
        for ln in streamed.text.splitlines()
        if ln.startswith("data:")
    ]
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    for event in events:
        conforms("ResponseStreamEvent", event)
    response_id = events[-1]["response"]["id"]
    conforms("Response", api.get(f"/v1/responses/{response_id}").json())
    conforms("ResponseItemList", api.get(f"/v1/responses/{response_id}/input_items").json())


def test_models(api: httpx.Client) -> None:
    listed = api.get("/v1/models").json()
    conforms("ListModelsResponse", listed)
    conforms("Model", api.get("/v1/models/smollm2").json())


def test_files_and_batches(api: httpx.Client) -> None:
    content = jsonl([line("a", "hi", model="smollm2")])
    uploaded = api.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    ).json()
    conforms("OpenAIFile", uploaded)
    conforms("OpenAIFile", api.get(f"/v1/files/{uploaded['id']}").json())
    conforms("ListFilesResponse", api.get("/v1/files").json())
    batch = api.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    ).json()
    conforms("Batch", batch)
    conforms("Batch", api.get(f"/v1/batches/{batch['id']}").json())
    conforms("ListBatchesResponse", api.get("/v1/batches").json())
    other = api.post(
        "/v1/files", files={"file": ("x.jsonl", content)}, data={"purpose": "batch"}
    ).json()
    conforms("DeleteFileResponse", api.delete(f"/v1/files/{other['id']}").json())


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [
        ("POST", "/v1/chat/completions", {"model": "smollm2"}, {}, 400),
        ("POST", "/v1/chat/completions", b"{oops", {}, 400),
        ("GET", "/v1/models", None, {"authorization": "Bearer ty-wrong"}, 401),
        ("POST", "/v1/chat/completions", {"model": "nope", "messages": CHAT}, {}, 404),
        ("GET", "/v1/nowhere", None, {}, 404),
        ("PUT", "/v1/models", None, {}, 405),
        ("POST", "/v1/chat/completions", {"model": "smollm2", "messages": CHAT, "n": 99}, {}, 400),
        (
            "POST",
            "/v1/chat/completions",
            {"model": "smollm2", "messages": CHAT, "max_tokens": 1000},
            {},
            429,
        ),
    ],
)
def test_errors(
    api: httpx.Client, method: str, path: str, body: Any, headers: dict, status: int
) -> None:
    content = body if isinstance(body, bytes) else None
    reply = api.request(
        method, path, json=None if content else body, content=content, headers=headers
    )
    assert reply.status_code == status, reply.text
    conforms("ErrorResponse", reply.json())


def test_the_validators_reject_what_breaks_the_schema() -> None:
    good = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "logprobs": None,
                "message": {"role": "assistant", "content": "hi", "refusal": None},
            }
        ],
    }
    assert problems("CreateChatCompletionResponse", good) == []
    without_refusal = json.loads(json.dumps(good))
    del without_refusal["choices"][0]["message"]["refusal"]
    assert problems("CreateChatCompletionResponse", without_refusal)
    assert problems("CreateChatCompletionResponse", {**good, "created": "yesterday"})
    assert problems("ErrorResponse", {"error": {"message": "m", "type": "t"}})  # param, code
