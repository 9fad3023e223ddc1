"""Batch input and output in OpenAI's JSONL format.

Input: one request a line, `{"custom_id", "method": "POST", "url", "body"}`. A malformed line does
not fail the job: it becomes a request that is already failed, reported in the error file. Output:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}` per request
that got a response, `{..., "response": null, "error": {"code", "message"}}` per one that did not.
"""

from dataclasses import dataclass
from typing import Any

import msgspec

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


@dataclass
class Line:
    """One input request: its body to run, or why it cannot run."""

    custom_id: str | None
    body: bytes
    error: tuple[str, str] | None = None  # (code, message)


def _check(item: Any, endpoint: str, seen: set[str]) -> Line:
    if not isinstance(item, dict):
        return Line(None, b"", ("invalid_request", "the line is not a JSON object"))
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(None, b"", ("missing_custom_id", "custom_id must be a non-empty string"))
    if custom_id in seen:
        return Line(custom_id, b"", ("duplicate_custom_id", f"custom_id {custom_id!r} repeats"))
    seen.add(custom_id)
    if item.get("method", "POST") != "POST":
        return Line(custom_id, b"", ("invalid_method", "method must be POST"))
    if item.get("url", endpoint) != endpoint:
        return Line(custom_id, b"", ("invalid_url", f"url must be the batch's endpoint {endpoint}"))
    body = item.get("body")
    if not isinstance(body, dict):
        return Line(custom_id, b"", ("invalid_body", "body must be a JSON object"))
    # batch replies are whole JSON objects, never streams
    body.pop("stream", None)
    body.pop("stream_options", None)
    return Line(custom_id, msgspec.json.encode(body))


def check_items(items: list[Any], endpoint: str) -> list[Line]:
    """The inline form's requests (already decoded), checked as file lines are; one without a
    custom_id is named by its position."""
    seen: set[str] = set()
    for i, item in enumerate(items):
        if isinstance(item, dict):
            item.setdefault("custom_id", str(i))
    return [_check(item, endpoint, seen) for item in items]


def parse_lines(content: bytes, endpoint: str) -> list[Line]:
    """Every non-blank line of an input file, in order."""
    seen: set[str] = set()
    lines: list[Line] = []
    for raw in content.splitlines():
        if not raw.strip():
            continue
        try:
            item = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            lines.append(Line(None, b"", ("invalid_json_line", f"the line is not JSON: {exc}")))
            continue
        lines.append(_check(item, endpoint, seen))
    return lines


def output_line(
    row_id: str,
    custom_id: str | None,
    status_code: int | None,
    request_id: str | None,
    response: bytes | None,
    error: tuple[str, str] | None,
) -> bytes:
    if status_code is None:
        code, message = error or ("internal_error", "no response")
        reply = None
        err: dict[str, str] | None = {"code": code, "message": message}
    else:
        try:
            decoded = msgspec.json.decode(response or b"null")
        except msgspec.DecodeError:
            decoded = (response or b"").decode(errors="replace")
        reply = {"status_code": status_code, "request_id": request_id, "body": decoded}
        err = None
    return msgspec.json.encode(
        {"id": row_id, "custom_id": custom_id, "response": reply, "error": err}
    )
