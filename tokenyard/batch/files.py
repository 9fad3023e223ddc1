"""Batch input and output in OpenAI's JSONL format.

Input: one request a line, `{"custom_id", "method": "POST", "url", "body"}`. A malformed line does
not fail the job: it becomes a request that is already failed, reported in the error file. Output:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}` per request
that got a response, `{..., "response": null, "error": {"code", "message"}}` per one that did not.
"""

import re
from typing import Any, NamedTuple

import msgspec

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
    "/v1/rerank": "rerank",  # not OpenAI's: a corpus reranked at the batch tier's price
}
MAX_CUSTOM_ID = 512  # characters: it is stored in SQL and echoed in every output line
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # PostgreSQL refuses a NUL in a text column
# what decoding client JSON can raise: malformed JSON (invalid UTF-8 included), nesting deeper than
# the decoder recurses
UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


class Line(NamedTuple):
    """One input request: its body to run, or why it cannot run. A tuple of strings and bytes,
    which the garbage collector stops tracking: a job's thousands of them add no work to its
    full passes (which pause every thread)."""

    custom_id: str | None
    body: bytes
    error: tuple[str, str] | None = None  # (code, message)


def is_plain(text: str, max_length: int) -> bool:
    """Short enough, and no control characters: fit for a SQL text column and a log line."""
    return len(text) <= max_length and not _CONTROL.search(text)


def _check(item: Any, endpoint: str, seen: set[str]) -> Line:
    if not isinstance(item, dict):
        return Line(None, b"", ("invalid_request", "the line is not a JSON object"))
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(None, b"", ("missing_custom_id", "custom_id must be a non-empty string"))
    if not is_plain(custom_id, MAX_CUSTOM_ID):
        why = f"custom_id must be at most {MAX_CUSTOM_ID} characters, none a control character"
        return Line(None, b"", ("invalid_custom_id", why))
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


def check_items(items: list[msgspec.Raw], endpoint: str) -> list[Line]:
    """The inline form's requests, checked as file lines are; one without a custom_id is named by
    its position. Each is decoded here, one at a time, and only its body kept: thousands of
    decoded requests held at once made the garbage collector pause the whole process (every
    request the gateway serves) for over 100 ms at a time."""
    seen: set[str] = set()
    lines: list[Line] = []
    for i, raw in enumerate(items):
        item = msgspec.json.decode(raw)  # a part of a body that was decoded: valid JSON
        if isinstance(item, dict):
            item.setdefault("custom_id", str(i))
        lines.append(_check(item, endpoint, seen))
    return lines


def _raw_lines(content: bytes) -> list[bytes]:
    return [raw for raw in content.splitlines() if raw.strip()]


def count_lines(content: bytes) -> int:
    """An input file's requests: its non-blank lines."""
    return len(_raw_lines(content))


def parse_lines(content: bytes, endpoint: str) -> list[Line]:
    """Every non-blank line of an input file, in order."""
    seen: set[str] = set()
    lines: list[Line] = []
    for raw in _raw_lines(content):
        try:
            item = msgspec.json.decode(raw)
        except UNREADABLE as exc:
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
        except UNREADABLE:
            decoded = (response or b"").decode(errors="replace")
        reply = {"status_code": status_code, "request_id": request_id, "body": decoded}
        err = None
    return msgspec.json.encode(
        {"id": row_id, "custom_id": custom_id, "response": reply, "error": err}
    )
