"""A run's spans, recorded by heddle itself; the OpenTelemetry SDK kept for configuration and transport.

The SDK's own start and end of a span (its span and the copy handed to the processors, a lock each,
every attribute cleaned through a bounded mapping, the sampler's result object, its tracer metrics)
costs some 85 us of CPU a span, and a served request makes five and more: more than the 3% of a request's
CPU that tracing may cost. Here a span is a small object of slots (some 25 us), made current in the
OpenTelemetry context like any span, so `traceparent`, an incoming parent, nested spans and other
instrumented libraries see it as the SDK's; what configures a span is still the SDK's, read from the same `OTEL_*`
variables, and applied with its semantics:

- the sampler the provider reads (`OTEL_TRACES_SAMPLER`, `_ARG`): asked of every span, but for the
  default (`parentbased_always_on`), whose answer, the parent's decision, is taken here directly;
  an unsampled span is a NonRecordingSpan that still propagates (flags 00);
- the span limits (`OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`, `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`, ...): a
  value that is not a plain one (a string within the length limit, a number, a bool, a tuple of such
  strings) is cleaned by the SDK's own BoundedAttributes, the oldest attribute dropped and counted
  past the count limit;
- the provider's id generator, resource, and batch span processor (`OTEL_BSP_*`, flushed and shut
  down at exit), which hands the ended spans to heddle.engine.otlp to be written and sent.

A span records no events or links (heddle makes none); one added by another library is counted as
dropped, as the SDK counts those past its limits. Imported only when tracing is on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
_SAMPLED = TraceFlags.SAMPLED
# The W3C level-2 flag the SDK sets on a trace id its generator made at random (an older API has none).
_RANDOM: int = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
_FLAGS = {n: TraceFlags(n) for n in range(4)}
_UNSET, _OK = StatusCode.UNSET.value, StatusCode.OK.value
_SCALARS = frozenset((str, int, float, bool))  # exactly these: a subclass is cleaned as the SDK cleans it
_SAMPLES = (sampling.Decision.RECORD_AND_SAMPLE,)  # Decision.is_sampled()


class Recorder:
    """heddle's tracer: `start` makes a span as the SDK's tracer named `scope` would, for one provider."""

    def __init__(self, resource: Resource, processor: SpanProcessor, *, scope: str = "heddle",
                 sampler: sampling.Sampler | None = None, limits: SpanLimits | None = None,
                 ids: IdGenerator | None = None) -> None:
        limits = limits or SpanLimits()  # the OTEL_*_LIMIT variables
        # The provider reads the sampler from the environment, and shuts the processor down at exit.
        self.provider = TracerProvider(resource=resource, sampler=sampler, span_limits=limits, id_generator=ids)
        self.provider.add_span_processor(processor)
        self.processor = processor
        self.sampler = self.provider.sampler
        self.ids = self.provider.id_generator
        # As the provider's get_tracer(scope) names it (no version).
        self.scope = InstrumentationScope(scope, "")
        self.max_attributes = limits.max_span_attributes
        self.max_length = limits.max_span_attribute_length
        self._root_random = _RANDOM if _RANDOM and self.ids.is_trace_id_random() else 0

    @property
    def resource(self) -> Resource:
        return self.provider.resource  # the provider's, which it renews in a forked child

    def start(self, name: str, attributes: Mapping[str, Any], kind: str = "internal") -> trace_api.Span:
        """A started span, a child of the current context's span (local or remote); not yet current."""
        parent: SpanContext | None = trace_api.get_current_span().get_span_context()
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            random = parent.trace_flags & _RANDOM
        else:
            parent = None
            trace_id = self.ids.generate_trace_id()
            random = self._root_random
        span_kind = KINDS[kind]
        if self.sampler is sampling.DEFAULT_ON:
            # ParentBased(ALWAYS_ON): a root is sampled, a child as its parent was; the parent's state kept.
            sampled = parent is None or parent.trace_flags.sampled
            state = parent.trace_state if parent is not None else None
            given: Mapping[str, Any] = attributes
        else:
            result = self.sampler.should_sample(None, trace_id, name, span_kind, attributes, ())
            # RECORD_ONLY records a span no processor exports: one not recorded is the same to a collector.
            sampled = result.decision in _SAMPLES
            state, given = result.trace_state, result.attributes
        context = SpanContext(trace_id, self.ids.generate_span_id(), False,
                              _FLAGS[(_SAMPLED if sampled else 0) | random], state)
        if not sampled:
            return NonRecordingSpan(context)
        return Span(self, name, context, parent, span_kind, given)


def _plain(attributes: Mapping[str, Any], length: int | None) -> bool:
    """Whether every attribute is one the SDK keeps as it is: a string key, and a value it would not
    clean (a list becomes a tuple, a long string is cut, an unknown type becomes its str())."""
    for key, value in attributes.items():
        if type(value) not in _SCALARS and (type(value) is not tuple or not all(type(v) is str for v in value)):
            return False
        if type(key) is not str or not key:
            return False
    return length is None or not any(
        len(value) > length if type(value) is str else type(value) is tuple and any(len(v) > length for v in value)
        for value in attributes.values())


class Span(trace_api.Span):
    """A recording span: what OTLP sends of it, and nothing more. Written by the task it is current
    in; read by the batch processor's thread only once ended (attributes set after the end are
    refused, as the SDK refuses them)."""

    __slots__ = ("attributes", "context", "description", "dropped_attributes", "dropped_events", "dropped_links",
                 "end_time", "kind", "name", "parent", "recorder", "start_time", "status_code")

    def __init__(self, recorder: Recorder, name: str, context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, attributes: Mapping[str, Any]) -> None:
        self.recorder = recorder
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.end_time: int | None = None
        self.dropped_attributes = self.dropped_events = self.dropped_links = 0
        self.status_code = _UNSET
        self.description: str | None = None
        limit = recorder.max_attributes
        if attributes and _plain(attributes, recorder.max_length) and (limit is None or len(attributes) <= limit):
            self.attributes: dict[str, Any] = dict(attributes)
        else:
            self.attributes = {}
            if attributes:
                self.set_attributes(attributes)
        self.start_time = time.time_ns()

    def _put(self, attributes: Mapping[str, Any]) -> None:
        # As the SDK's BoundedAttributes: a key set again moves to the end; past the limit the oldest goes.
        mine, limit = self.attributes, self.recorder.max_attributes
        for key, value in attributes.items():
            if key in mine:
                del mine[key]
            elif limit is not None and len(mine) >= limit:
                del mine[next(iter(mine))]
                self.dropped_attributes += 1
            mine[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.end_time is not None:
            return
        if self.recorder.max_attributes == 0:
            self.dropped_attributes += len(attributes)
        elif _plain(attributes, self.recorder.max_length):
            self._put(attributes)
        else:  # cleaned as the SDK cleans them, the keys it refuses counted
            cleaned = BoundedAttributes(None, attributes, max_value_len=self.recorder.max_length)
            self.dropped_attributes += cleaned.dropped
            self._put(cleaned)

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is not None:
            return
        if self.recorder.max_attributes == 0 or not key or not isinstance(key, str):
            self.dropped_attributes += 1
        else:
            one = {key: value}
            self._put(one if _plain(one, self.recorder.max_length)
                      else BoundedAttributes(None, one, max_value_len=self.recorder.max_length))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None or self.status_code == _OK:  # OK is final
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self.status_code, self.description = status.status_code.value, status.description

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    # Events and links (an exception is an event) another library adds: counted as dropped, not kept.
    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        del name, attributes, timestamp
        if self.end_time is None:
            self.dropped_events += 1

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        del context, attributes
        if self.end_time is None:
            self.dropped_links += 1

    def record_exception(self, exception: BaseException, attributes: Any = None, timestamp: int | None = None,
                         escaped: bool = False) -> None:
        del exception, attributes, timestamp, escaped
        self.add_event("exception")

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is None:
            self.end_time = end_time if end_time is not None else time.time_ns()
            self.recorder.processor.on_end(self)  # type: ignore[arg-type]  # what it reads: .context

    def __repr__(self) -> str:
        return f"Span(name={self.name!r}, context={self.context})"

    def readable(self) -> ReadableSpan:
        """The SDK's form of this span, for an SDK whose exporter encodes spans itself."""
        attributes = BoundedAttributes(None, self.attributes)
        attributes.dropped = self.dropped_attributes
        return ReadableSpan(self.name, self.context, self.parent, self.recorder.resource, attributes,
                            kind=self.kind, status=Status(StatusCode(self.status_code), self.description),
                            start_time=self.start_time, end_time=self.end_time,
                            instrumentation_scope=self.recorder.scope)
