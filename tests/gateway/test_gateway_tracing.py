"""OpenTelemetry spans of the walk, read from the SDK's in-memory exporter: the gateway app runs in
this process (Litestar's test client) in front of the fake upstream, with a tracer handed in."""

from collections.abc import Iterator
from typing import Any

import pytest
import sqlmodel
from litestar.testing import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.gateway.conftest import MODEL, wait_until
from tokenyard.app import create_app
from tokenyard.billing.models import UsageRecord
from tokenyard.core.settings import Settings
from tokenyard.gateway.tracing import Tracing

CHAT = [{"role": "user", "content": "hello there"}]
WALK = ["auth", "route", "quota.reserve", "upstream", "settle"]


@pytest.fixture
def traced(
    base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    for name, value in base_env.items():
        if name.startswith("TOKENYARD_"):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with TestClient(create_app(Settings())) as client:
        proxy = client.app.state.proxy
        assert proxy.tracing.tracer is None  # no OTLP endpoint: off
        proxy.tracing = Tracing(provider)
        yield client, exporter


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def _post(client: TestClient, key: str, **body: Any) -> Any:
    headers = {"authorization": f"Bearer {key}"}
    return client.post("/v1/chat/completions", json={"model": MODEL, **body}, headers=headers)


def test_a_request_is_one_trace_joined_to_its_usage_record(
    traced: tuple[TestClient, InMemorySpanExporter], team: Any, sql: Any
) -> None:
    client, exporter = traced
    name, key = team()
    reply = _post(client, key, messages=CHAT, max_tokens=3)
    assert reply.status_code == 200
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"gateway.request", *WALK}
    root = spans["gateway.request"]
    request_id = reply.headers["x-request-id"]
    assert root.attributes["tokenyard.request_id"] == request_id
    assert root.attributes["tokenyard.team"] == name
    assert root.attributes["http.response.status_code"] == 200
    for child in WALK:
        assert spans[child].parent.span_id == root.context.span_id
        assert spans[child].context.trace_id == root.context.trace_id
    route = spans["route"].attributes
    assert route["tokenyard.route.decision"] == "direct"
    assert route["tokenyard.route.served"] == MODEL
    assert spans["quota.reserve"].attributes["tokens"] > 0
    assert spans["settle"].attributes["tokenyard.completion_tokens"] == 3
    # the order of the walk
    starts = [spans[child].start_time for child in WALK]
    assert starts == sorted(starts)

    def record() -> list[UsageRecord]:
        with sqlmodel.Session(sql) as session:
            query = sqlmodel.select(UsageRecord).where(UsageRecord.request_id == request_id)
            return list(session.exec(query))

    wait_until(record, 10, "the traced request's usage record")
    assert record()[0].team == name


def test_a_stream_traces_its_upstream_until_the_end(
    traced: tuple[TestClient, InMemorySpanExporter], team: Any
) -> None:
    client, exporter = traced
    _, key = team()
    reply = _post(client, key, messages=CHAT, max_tokens=4, stream=True)
    assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    wait_until(lambda: "gateway.request" in _by_name(exporter.get_finished_spans()), 5, "root")
    spans = _by_name(exporter.get_finished_spans())
    upstream = spans["upstream"]
    assert upstream.attributes["stream"] is True
    assert 0 < upstream.attributes["tokenyard.ttft_s"] < 5
    assert upstream.end_time <= spans["settle"].start_time  # closed, then settled


def test_refusals_end_the_trace_without_a_reservation(
    traced: tuple[TestClient, InMemorySpanExporter], team: Any
) -> None:
    client, exporter = traced
    assert _post(client, "ty-nope", messages=CHAT).status_code == 401
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"gateway.request", "auth"}
    assert spans["gateway.request"].attributes["http.response.status_code"] == 401
    assert [e.name for e in spans["auth"].events] == ["exception"]
    exporter.clear()
    _, key = team(rpm=1)
    assert _post(client, key, messages=CHAT, max_tokens=2).status_code == 200
    exporter.clear()
    assert _post(client, key, messages=CHAT, max_tokens=2).status_code == 429
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"gateway.request", "auth", "route", "quota.reserve"}
    assert spans["gateway.request"].attributes["http.response.status_code"] == 429


def test_otlp_export_only_when_the_endpoint_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    off = Tracing.from_settings(Settings())
    assert off.tracer is None and off.begin("id", "chat").root.__class__.__name__ == "_Off"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    on = Tracing.from_settings(Settings())
    assert on.tracer is not None
    processors = on.provider._active_span_processor._span_processors  # type: ignore[union-attr]
    exporters = [type(p.span_exporter).__name__ for p in processors]
    assert exporters == ["OTLPSpanExporter"]
    on.provider.shutdown()  # type: ignore[union-attr]
