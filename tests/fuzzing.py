"""Schema-driven fuzzing (schemathesis) of a server on loopback, from its own OpenAPI document.

Every operation gets a bounded number of drawn requests, valid ones (positive) and ones that break
the schema (negative). No answer may be a 5xx, and every error must be OpenAI's error shape.
"""

import json
from collections.abc import Callable

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode

SCHEMA_PATH = "/schema/openapi.json"
# uvicorn's answer to a request that is not valid HTTP (the negative mode draws headers such as an
# empty Content-Length): refused before any application code runs
NOT_HTTP = b"Invalid HTTP request received."


def check_answer(case: Case, status: int, body: bytes) -> None:
    """No 5xx; a 4xx is `{"error": {"message": str, "type": str, "param": …, "code": …}}`
    (Anthropic's `{"type": "error", "error": {"type": str, "message": str}}` on its routes,
    Google's `{"error": {"code": int, "message": str, "status": str}}` on Gemini's)."""
    where = f"{case.method} {case.formatted_path} body={case.body!r} query={case.query!r}"
    assert status < 500, f"{status} from {where}: {body[:500]!r}"
    if status < 400:
        return
    if status == 400 and body == NOT_HTTP:  # the server's HTTP parser refused it: no app saw it
        return
    if case.path.startswith("/v1/messages"):  # Anthropic's API: Anthropic's error shape
        answer = json.loads(body)
        assert answer["type"] == "error", where
        assert isinstance(answer["error"]["type"], str), where
        assert isinstance(answer["error"]["message"], str), where
        return
    if case.path.startswith("/v1beta/"):  # Gemini's API: Google's error shape
        error = json.loads(body)["error"]
        assert error["code"] == status and isinstance(error["message"], str), where
        assert isinstance(error["status"], str) and error["status"].isupper(), where
        return
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError) as exc:
        raise AssertionError(
            f"{status} not in OpenAI's shape from {where}: {body[:200]!r}"
        ) from exc
    assert isinstance(error["message"], str), where
    assert isinstance(error["type"], str), where
    assert {"param", "code"} <= error.keys(), where
    assert all(error[k] is None or isinstance(error[k], str) for k in ("param", "code")), where


def fuzz(
    base_url: str,
    examples: int,
    *,
    headers: dict[str, str] | None = None,
    prepare: Callable[[Case], None] = lambda case: None,
    skip: Callable[[str, str], bool] = lambda method, path: False,
) -> list[str]:
    """Fuzz every operation of the server's document at `base_url`; returns the operations run.
    `prepare` may adjust a drawn case before it is sent; `skip(method, path)` leaves one out."""
    schema = schemathesis.openapi.from_url(base_url + SCHEMA_PATH)
    schema.validate()
    ran = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if skip(operation.method.upper(), operation.path):
            continue
        ran.append(f"{operation.method.upper()} {operation.path}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,  # no example files written into the checkout
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Case) -> None:
                prepare(case)
                response = case.call(base_url=base_url, headers=headers, timeout=30)
                check_answer(case, response.status_code, response.content)

            try:
                run()
            except Unsatisfiable:
                # nothing to break: an operation without parameters, body or credential
                assert mode == GenerationMode.NEGATIVE
    return ran
