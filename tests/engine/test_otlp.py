"""heddle records its spans itself (heddle/engine/spans.py) and writes their protobuf (heddle/engine/otlp.py):
what it sends is the very message the SDK's own tracer and encoder would send of the same spans, under
the same sampler, span limits, ids, resource and parents; and the tracer a run asks for follows the
environment. In-process: nothing is sent."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest
from opentelemetry import context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from heddle.engine import otlp, tracing
from heddle.engine.spans import Recorder


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


class Ids(IdGenerator):
    """The same ids, in the same order, for both tracers; the low half of every other trace id over
    half the range (a ratio sampler of 0.5 keeps one root in two)."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (self.n << 64) | (0xF000_0000_0000_0000 if self.n % 2 else 0x0100) | self.n

    def is_trace_id_random(self) -> bool:
        return True


class Level(enum.IntEnum):
    HIGH = 3


Tree = Callable[[Callable[..., Any]], None]
KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
RESOURCE = Resource.create({"service.name": "heddle", "count": 3, "names": ["a", "b"]},
                           schema_url="https://example.test/r")


def _both(tree: Tree) -> tuple[ExportTraceServiceRequest, ExportTraceServiceRequest, list[Any]]:
    """The request the SDK's tracer and encoder make of `tree`'s spans, the one heddle makes, and
    heddle's spans; timestamps (each side's clock) checked and left out."""
    sdk_kept, kept = Kept(), Kept()
    provider = TracerProvider(resource=RESOURCE, id_generator=Ids())
    provider.add_span_processor(SimpleSpanProcessor(sdk_kept))
    sdk_tracer = provider.get_tracer("heddle")

    @contextlib.contextmanager
    def sdk_span(name: str, attributes: dict[str, Any], *, kind: str = "internal") -> Iterator[Span]:
        # What Tracing.span does, with the SDK's tracer.
        with sdk_tracer.start_as_current_span(name, kind=KINDS[kind], attributes=attributes, record_exception=False,
                                              set_status_on_exception=False) as span:
            try:
                yield span
            except Exception as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, None))
                raise

    tree(sdk_span)
    recorder = Recorder(RESOURCE, SimpleSpanProcessor(kept), ids=Ids())
    tree(tracing.Tracing(recorder).span)
    provider.shutdown()
    recorder.provider.shutdown()
    theirs, ours = encode_spans(sdk_kept.spans), ExportTraceServiceRequest.FromString(otlp.encode(kept.spans))
    for request in (theirs, ours):
        for span in (s for r in request.resource_spans for scope in r.scope_spans for s in scope.spans):
            assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
            span.start_time_unix_nano = span.end_time_unix_nano = 0
    assert len(kept.spans) == len(sdk_kept.spans)
    return theirs, ours, kept.spans


def _traceparent() -> str:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier["traceparent"]


def _run(span: Callable[..., Any]) -> None:
    """A request's span under its caller's traceparent, a run, a tool call, its program, a model call,
    a failing tool; then a trace of its own."""
    values = {"s": "x", "empty": "", "yes": True, "no": False, "zero": 0, "neg": -5, "big": 2**62, "f": 0.0,
              "g": -2.5, "raw": b"\x00\x01", "strs": ["a", "b"], "ints": [1, -2], "bools": [True], "mixed": [],
              "none": None, "\u00e9": "\u2603", "huge": 2**70, "map": {"k": [1]}, "path": PurePosixPath("/a"),
              "level": Level.HIGH, "signers": ("k1", "k2")}
    caller = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v,q=r"}
    token = context.attach(TraceContextTextMapPropagator().extract(caller))
    try:
        with span("POST /v1/runs", {"http.request.method": "POST", **values}, kind="server") as request:
            with span("invoke_agent flow", {"heddle.bundle.digest": "sha256:ab", "heddle.bundle.signer": ("k",),
                                            "gen_ai.operation.name": "invoke_agent"}):
                with span("execute_tool add", {"gen_ai.tool.name": "add", "heddle.node": "n"}) as tool:
                    with span("heddle.sandbox", {"heddle.sandbox.safe": False}):
                        assert _traceparent().endswith("-01")
                    tool.set_attributes({"heddle.tool.outcome": "ok", "heddle.tool.duration_ms": 1.5,
                                         "gen_ai.tool.name": "x"})
                    tool.set_attribute("heddle.tool.exit_code", 0)
                    tool.set_status(Status(StatusCode.OK))
                    tool.set_status(StatusCode.ERROR, "after OK: kept OK")
                with span("chat m", {"gen_ai.request.model": "m"}, kind="client") as chat:
                    chat.set_attribute("gen_ai.response.finish_reasons", ["stop"])
                    chat.update_name("chat model")
                with pytest.raises(RuntimeError), span("execute_tool boom", {"gen_ai.tool.name": "boom"}):
                    raise RuntimeError("content")
                with span("failed", {}) as failed:
                    failed.set_status(StatusCode.ERROR, "why")
            request.set_attribute("http.response.status_code", 200)
        request.set_attribute("late", "refused")
    finally:
        context.detach(token)
    with span("invoke_agent own", {"a": 1}):
        assert _traceparent().endswith("-03")  # sampled, its trace id made at random
    token = context.attach(TraceContextTextMapPropagator().extract({**caller, "traceparent": caller["traceparent"][:-2]
                                                                    + "00"}))
    try:  # a caller that did not sample: nothing recorded, its trace carried on
        with span("unsampled", {"a": 1}), span("under it", {}):
            assert _traceparent().startswith("00-0af7651916cd43dd8448eb211c80319c-")
            assert _traceparent().endswith("-00")
    finally:
        context.detach(token)


def test_heddles_spans_are_the_message_the_sdk_sends() -> None:
    theirs, ours, spans = _both(_run)
    assert ours == theirs
    assert len(spans) == 8 and {s.name for s in spans} >= {"chat model", "invoke_agent own"}
    # The SDK's own form of them (an exporter that encodes itself) is the same message.
    readable = encode_spans([s.readable() for s in spans])
    for span in (s for r in readable.resource_spans for scope in r.scope_spans for s in scope.spans):
        span.start_time_unix_nano = span.end_time_unix_nano = 0
    assert readable == ours
    assert otlp.encode([]) == encode_spans([]).SerializeToString() == b""


def test_span_limits_apply_as_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "3")

    def tree(span: Callable[..., Any]) -> None:
        with span("limited", {"a": "long value", "b": ("abcd", "x"), "c": 1, "": "no key", "d": [["nested"]]}) as one:
            one.set_attributes({"e": {"k": "long"}, "a": "short", 5: "int key"})
            one.set_attribute("", "refused")
            one.set_attribute("f", PurePosixPath("/long/path"))
        with span("plain", {"x": "ok"}) as two:
            two.set_attributes({f"k{i}": i for i in range(6)})

    theirs, ours, spans = _both(tree)
    assert ours == theirs
    assert spans[0].dropped_attributes > 0 and spans[0].attributes["a"] == "sho"


def test_a_sampler_from_the_environment_drops_as_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    parents: list[str] = []

    def tree(span: Callable[..., Any]) -> None:
        for n in range(4):
            with span(f"root {n}", {"n": n}), span(f"child {n}", {"n": n}):
                parents.append(_traceparent())
        # A caller that did not sample: nothing of its trace is recorded, and it still propagates.
        token = context.attach(set_span_in_context(get_current_span(TraceContextTextMapPropagator().extract(
            {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}))))
        try:
            with span("unsampled", {}):
                parents.append(_traceparent())
        finally:
            context.detach(token)

    theirs, ours, spans = _both(tree)
    assert ours == theirs
    assert {s.name for s in spans} == {"root 1", "child 1", "root 3", "child 3"}
    half = len(parents) // 2
    assert parents[:half] == parents[half:]  # the same traceparents, flags included, on both sides
    assert [p[-2:] for p in parents[half:]] == ["02", "03", "02", "03", "00"]
    assert parents[-1].startswith("00-0af7651916cd43dd8448eb211c80319c-")


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
