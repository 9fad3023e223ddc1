"""The engine server's OpenAPI document, and schema-driven fuzzing of it (SmolLM2 on CPU)."""

from typing import Any

import httpx
import schemathesis
from schemathesis import Case

from tests.engine.test_server import server, wait_idle  # noqa: F401 - the server fixture, by name
from tests.fuzzing import SCHEMA_PATH, fuzz

ROUTES = {
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /tokenize",
    "POST /detokenize",
    "GET /v1/models",
    "POST /v1/load_lora_adapter",  # 403 here: this engine does not load adapters at run time
    "POST /v1/unload_lora_adapter",
    "GET /health",
    "GET /load",
    "GET /metrics",
}
EXAMPLES = 8  # per operation and generation mode: each completion runs the model on the CPU
MAX_TOKENS = 2


def test_schema_is_valid_openapi_and_lists_every_route(server: tuple[str, Any]) -> None:  # noqa: F811
    doc = httpx.get(server[0] + SCHEMA_PATH).json()
    schemathesis.openapi.from_dict(doc).validate()
    assert {f"{m.upper()} {path}" for path, item in doc["paths"].items() for m in item} == ROUTES
    body = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert {"model", "prompt"} <= set(body["schema"]["required"])


def _short(case: Case) -> None:
    """Aim drawn bodies at the served model and keep generation short: a length left out, null or
    above MAX_TOKENS becomes MAX_TOKENS; other values (wrong types, 0, negatives) stay, to be
    refused."""
    body = case.body
    if not isinstance(body, dict):
        return
    if "model" in body:
        body["model"] = "smollm2"
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if value is None or (type(value) is int and value > MAX_TOKENS):
            body[field] = MAX_TOKENS


def test_fuzz_engine_server(server: tuple[str, Any]) -> None:  # noqa: F811
    url, core = server
    assert set(fuzz(url, EXAMPLES, prepare=_short)) == ROUTES
    wait_idle(url, core)  # every sequence ended and every KV block free again


def test_sampling_values_found_by_the_fuzzer_answer(server: tuple[str, Any]) -> None:  # noqa: F811
    """A top_p or temperature that rounds to 0 in float32 emptied the distribution: a 500."""
    url, core = server
    for extreme in ({"top_p": 3.5e-270}, {"temperature": 1e-300}):
        body = {"model": "smollm2", "prompt": "Hi", "max_tokens": MAX_TOKENS, **extreme}
        answer = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, (extreme, answer.text)
    wait_idle(url, core)
