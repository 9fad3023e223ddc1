"""The gateway's OpenAPI document, and schema-driven fuzzing of a gateway on loopback (issue 14)."""

from typing import Any

import httpx
import schemathesis
from schemathesis import Case

from tests.fuzzing import SCHEMA_PATH, fuzz
from tests.gateway.conftest import (
    MODEL,
    Gateway,
    RedisServer,
    reservations,
    upstream_stats,
    wait_until,
)

PUBLIC = {
    "POST /v1/chat/completions",
    "GET /v1/chat/completions",
    "GET /v1/chat/completions/{completion_id}",
    "POST /v1/chat/completions/{completion_id}",
    "DELETE /v1/chat/completions/{completion_id}",
    "GET /v1/chat/completions/{completion_id}/messages",
    "GET /v1beta/models",
    "GET /v1beta/models/{name}",
    "POST /v1beta/models/{call}",
    "POST /v1/completions",
    "POST /v1/responses",
    "POST /v1/responses/input_tokens",
    "POST /v1/messages/count_tokens",
    "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}",
    "GET /v1/responses/{response_id}/input_items",
    "POST /v1/conversations",
    "GET /v1/conversations/{conversation_id}",
    "POST /v1/conversations/{conversation_id}",
    "DELETE /v1/conversations/{conversation_id}",
    "POST /v1/conversations/{conversation_id}/items",
    "GET /v1/conversations/{conversation_id}/items",
    "GET /v1/conversations/{conversation_id}/items/{item_id}",
    "DELETE /v1/conversations/{conversation_id}/items/{item_id}",
    "GET /v1/models",
    "GET /v1/usage",
    "GET /v1/admin/usage",
    "POST /v1/files",
    "GET /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content",
    "POST /v1/batches",
    "GET /v1/batches",
    "GET /v1/batches/{batch_id}",
    "POST /v1/batches/{batch_id}/cancel",
    "POST /v1/batch",
    "GET /v1/batch/webhook_secret",
    "POST /v1/batch/webhook_secret",
    "GET /health",
    "GET /ready",
    "GET /metrics",
}
EXAMPLES = 15  # per operation and generation mode: the whole run stays within about a minute


def _operations(doc: dict[str, Any]) -> set[str]:
    return {f"{method.upper()} {path}" for path, item in doc["paths"].items() for method in item}


def test_schema_is_valid_openapi_and_lists_every_public_route(gateway: Gateway) -> None:
    doc = httpx.get(gateway.url + SCHEMA_PATH).json()
    schemathesis.openapi.from_dict(doc).validate()
    assert _operations(doc) >= PUBLIC
    # raw-body routes still document their bodies
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = chat["content"]["application/json"]["schema"]
    assert {"model", "messages"} <= schema["properties"].keys()
    assert "$ref" not in str(schema)
    for path in ("/v1/completions", "/v1/batches", "/v1/batch", "/v1/files"):
        assert doc["paths"][path]["post"]["requestBody"]["required"]


def _aim(case: Case) -> None:
    """Point drawn bodies at the fake upstream's model, so that they get past the catalog to
    reservations and the upstream; and drop callback URLs, which could name any host (tests send
    traffic to loopback only)."""
    if isinstance(case.body, dict):
        if "model" in case.body:
            case.body["model"] = MODEL
        case.body.pop("callback_url", None)


def test_fuzz_gateway(
    gateway: Gateway, team: Any, redis_server: RedisServer, upstream: str
) -> None:
    name, key = team(concurrency=64)
    ran = fuzz(
        gateway.url,
        EXAMPLES,
        headers={"authorization": f"Bearer {key}"},
        prepare=_aim,
    )
    assert set(ran) >= PUBLIC
    # every reservation comes back: interactive ones at once, batch ones when the worker is done
    r = redis_server.client()

    def released() -> bool:
        held = reservations(r, name)
        return held["leases"] == held["pages"] == 0 and upstream_stats(upstream)["active"] == 0

    wait_until(released, 30, "the fuzzed team's leases and KV pages to return")
