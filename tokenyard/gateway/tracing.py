"""OpenTelemetry spans of each request's walk: a `gateway.request` span (its request id as
`tokenyard.request_id`, the key that joins it to the usage record) with children `auth`, `route`
(the router's decision), `quota.reserve`, `upstream` (one per model tried; a stream's lasts until
its end, with its time to first byte) and `settle`.

Exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set (the exporter reads it and the
other standard OTEL_EXPORTER_OTLP_* variables), batched off the request path; unset, tracing is off
and each call below returns at once, so the gateway's added latency does not move (measured in
bench/gateway_overhead.py --tracing).

A request's spans cross tasks (a stream is relayed, and settled, after its handler returned), so
the trace is carried explicitly on the request's reservation rather than in the ambient context.
"""

from typing import Any

from opentelemetry import trace as otel
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tokenyard.core.settings import Settings


class _Off:
    """The span of a request nobody traces: every call does nothing."""

    def __enter__(self) -> "_Off":
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_status(self, status: Any) -> None:
        pass

    def end(self) -> None:
        pass


OFF = _Off()


class RequestTrace:
    """One request's spans. With no tracer, every method is a no-op."""

    __slots__ = ("_context", "_tracer", "ended", "root", "settling", "upstream")

    def __init__(self, tracer: otel.Tracer | None, request_id: str, kind: str) -> None:
        self._tracer = tracer
        self.ended = False
        self.settling = False  # a reservation was made: its settling ends the trace
        self.upstream: Span | _Off = OFF  # the attempt in flight (a stream's, until it ends)
        if tracer is None:
            self.root: Span | _Off = OFF
            self._context = None
            return
        attributes = {"tokenyard.request_id": request_id, "tokenyard.endpoint": kind}
        root = tracer.start_span("gateway.request", kind=SpanKind.SERVER, attributes=attributes)
        self.root = root
        self._context = otel.set_span_in_context(self.root)

    def span(self, name: str, **attributes: Any) -> Any:
        """A child span for a `with` block: ended on exit, an exception recorded on it."""
        if self._tracer is None:
            return OFF
        return self._tracer.start_as_current_span(
            name, context=self._context, attributes=attributes
        )

    def start(self, name: str, **attributes: Any) -> Span | _Off:
        """A child span the caller ends (it may outlive the handler: a stream's upstream)."""
        if self._tracer is None:
            return OFF
        return self._tracer.start_span(name, context=self._context, attributes=attributes)

    def begin_upstream(self, model: str, stream: bool) -> None:
        self.end_upstream(0)  # the previous attempt's, which failed before its first byte
        self.upstream = self.start("upstream", **{"tokenyard.model": model, "stream": stream})

    def end_upstream(self, status: int, ttft: float | None = None) -> None:
        span, self.upstream = self.upstream, OFF
        if span is OFF:
            return
        span.set_attribute("http.response.status_code", status)
        if ttft is not None:
            span.set_attribute("tokenyard.ttft_s", ttft)
        span.end()

    def refused(self, status: int) -> None:
        """The walk raised: the end, unless a reservation was made (its settling ends it)."""
        if not self.settling:
            self.end(status)

    def end(self, status: int) -> None:
        """Once: the request's answer is settled (or it was refused before any reservation)."""
        if self.ended or self._tracer is None:
            return
        self.ended = True
        self.end_upstream(status)
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(Status(StatusCode.ERROR))
        self.root.end()


NO_TRACE = RequestTrace(None, "", "")  # a request nobody traces (off, or not an HTTP request)


class Tracing:
    """Where request traces come from: an OpenTelemetry tracer provider, or none (off)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("tokenyard.gateway") if provider else None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Tracing":
        if not settings.otlp_endpoint:
            return cls()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider = TracerProvider(resource=Resource.create({"service.name": "tokenyard-gateway"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider)

    def begin(self, request_id: str, kind: str) -> RequestTrace:
        return RequestTrace(self.tracer, request_id, kind)

    def shutdown(self) -> None:
        """Export what is still batched."""
        if self.provider is not None:
            self.provider.shutdown()
