"""The batch tests run against the gateway tests' fixtures: real Redis, the fake upstream, gateway
processes and teams; helpers to build batch input and wait for jobs."""

import time
from typing import Any

import msgspec
import openai

from tests.gateway.conftest import (  # noqa: F401 - fixtures, found by pytest through this module
    MODEL,
    base_env,
    data_dir,
    redis_server,
    sql,
    start_gateway,
    team,
    upstream,
)

FINAL = ("completed", "failed", "expired", "cancelled")
# a worker that polls often and leases briefly, so tests do not wait on production timings
FAST = {"batch_poll_s": "0.1", "batch_lease_s": "2"}


def line(custom_id: str, text: str = "hello", *, max_tokens: int = 4, model: str = MODEL) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    body["max_tokens"] = max_tokens
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(items: list[Any]) -> bytes:
    return b"".join(msgspec.json.encode(i) + b"\n" for i in items)


def submit(client: openai.OpenAI, items: list[Any], **kwargs: Any) -> Any:
    uploaded = client.files.create(file=("in.jsonl", jsonl(items)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        **kwargs,
    )


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in FINAL:
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} did not finish: {batch.status}")


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = client.files.content(file_id).content
    return [msgspec.json.decode(raw) for raw in content.splitlines() if raw.strip()]
