"""The spans' protobuf heddle writes (heddle/engine/otlp.py) is the message the SDK's own encoder makes,
for every kind of value, event, link, status and parent the SDK can hold; and the tracer a run asks for
follows the environment. In-process: nothing is sent."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from heddle.engine import otlp, tracing


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _provider(kept: Kept, **attributes: Any) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "heddle", **attributes},
                                                       schema_url="https://example.test/r"))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    return provider


def test_the_written_spans_are_the_sdks_message() -> None:
    kept = Kept()
    provider = _provider(kept, count=3, ratio=1.5, names=["a", "b"])
    traced = provider.get_tracer("heddle", "1.2", schema_url="https://example.test/s", attributes={"a": 1})
    other = provider.get_tracer("other")
    # Spans of another provider with an equal resource: grouped with the first, as the SDK groups them.
    twin = _provider(kept, count=3, ratio=1.5, names=["a", "b"]).get_tracer("heddle", "1.2",
                                                                             schema_url="https://example.test/s",
                                                                             attributes={"a": 1})
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("k", "v"), ("q", "r")]))
    values = {"s": "x", "empty": "", "yes": True, "no": False, "zero": 0, "neg": -5, "big": 2**62, "f": 0.0,
              "g": -2.5, "raw": b"\x00\x01", "strs": ["a", "b"], "ints": [1, -2], "bools": [True], "mixed": [],
              "none": None, "\u00e9": "\u2603", "huge": 2**70}
    for _ in range(2):  # the second time, the attributes come from those kept
        with traced.start_as_current_span("root", kind=SpanKind.SERVER, attributes=values) as root:
            root.add_event("ev", {"x": 1, "t": ("a",)})
            root.add_event("", timestamp=0)
            with other.start_as_current_span("child", kind=SpanKind.CLIENT, links=[Link(remote, {"l": "1"})]) as child:
                child.set_status(Status(StatusCode.ERROR, "bad"))
            with traced.start_as_current_span("", context=set_span_in_context(NonRecordingSpan(remote)),
                                              kind=SpanKind.CONSUMER) as consumer:
                consumer.set_status(Status(StatusCode.OK))
            with twin.start_as_current_span("p", kind=SpanKind.PRODUCER, attributes={"yes": 1, "no": 0}):
                pass
    assert len(kept.spans) == 8
    assert ExportTraceServiceRequest.FromString(otlp.encode(kept.spans)) == encode_spans(kept.spans)
    assert otlp.encode([]) == encode_spans([]).SerializeToString() == b""


def test_the_tracer_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.tracer() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    first = tracing.tracer()
    assert first is not None and tracing.tracer() is first
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:10")
    second = tracing.tracer()
    assert second is not None and second is not first
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.tracer() is first
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.tracer() is None
