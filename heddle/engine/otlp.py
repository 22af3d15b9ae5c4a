"""The OTLP/HTTP exporter of a run's spans (heddle.engine.spans): the SDK's, with the protobuf written here.

The SDK's encoder builds a protobuf object for every span, attribute and value before serializing
them, some 100 us a span, on the batch processor's thread but holding the GIL the run's loop needs.
Most of a run's attributes are the same from one span to the next (the bundle's digest and signers, a
tool's name, kind and schema fingerprint, the node), so here each attribute is written once into wire
bytes and kept. What is written decodes to the very message the SDK's encoder makes of the spans
its own tracer would have made (tests/engine/test_otlp.py), and it is sent by the SDK's exporter as
it would send its own.
Imported only when tracing is on (it imports the SDK).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

from heddle.engine.spans import Recorder, Span

_logger = logging.getLogger(__name__)

# Span.SpanKind of the protocol (0 is UNSPECIFIED, never written by the SDK).
_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3, SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
# SpanFlags: the context's is_remote is known; and is true.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_FIXED64, _FIXED32, _DOUBLE = struct.Struct("<Q"), struct.Struct("<I"), struct.Struct("<d")
_INT64 = 1 << 63
# Attributes written once and kept, bounded: values that change with each call (durations, call ids)
# fill it too, and it starts again when full.
_KEPT_MAX = 4096
_kept: dict[tuple[str, type, Any], bytes] = {}
# Spans written between two offers of the GIL: the run's loop waits for it a chunk's writing at most
# (about a millisecond), not the interpreter's switch interval (5 ms) again and again through a batch.
_CHUNK = 32


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length and the payload."""
    return tag + _varint(len(payload)) + payload


def _value(value: Any) -> bytes:
    """An AnyValue's payload, as the SDK's encoder makes it (the same order of type checks)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise ValueError(f"{value} is out of range for an int64 attribute")
        return b"\x18" + _varint(value & 0xFFFF_FFFF_FFFF_FFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> bytes:
    return (_field(b"\x0a", key.encode("utf-8")) if key else b"") + _field(b"\x12", _value(value))


def _attribute(key: str, value: Any) -> bytes:
    """One KeyValue with its length, taken from those kept when it was written before."""
    kind = type(value)
    keep = kind is str or kind is bool or kind is int or kind is tuple
    if keep:
        try:  # the kind in the key: True is 1, but its attribute is not
            return _kept[(key, kind, value)]
        except KeyError:
            keep = kind is not tuple or all(type(v) is str for v in value)
        except TypeError:  # a tuple holding a mapping
            keep = False
    written = _field(b"", _key_value(key, value))
    if keep:
        if len(_kept) >= _KEPT_MAX:
            _kept.clear()
        _kept[(key, kind, value)] = written
    return written


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    out: list[bytes] = []
    for key, value in attributes.items():
        try:
            written = _attribute(key, value)
        except Exception:  # as the SDK does: the attribute is left out, the span sent
            _logger.exception("Failed to encode key %s", key)
            continue
        out += (tag, written)
    return b"".join(out)


def _count(tag: bytes, n: int) -> bytes:
    return tag + _varint(n) if n else b""


# SpanFlags of a span: whether its parent is remote is known; and the parent is remote.
_LOCAL, _REMOTE = (b"\x85\x01" + _FIXED32.pack(f) for f in (_HAS_IS_REMOTE, _HAS_IS_REMOTE | _IS_REMOTE))
# A span's name and kind, written once for each name (a tool's spans are named by the tool).
_heads: dict[tuple[str, SpanKind], bytes] = {}


def _head(name: str, kind: SpanKind) -> bytes:
    try:
        return _heads[(name, kind)]
    except KeyError:
        if len(_heads) >= _KEPT_MAX:
            _heads.clear()
        written = _heads[(name, kind)] = ((_field(b"\x2a", name.encode("utf-8")) if name else b"")
                                          + b"\x30" + _varint(_KIND[kind]))
        return written


def _span(span: Span) -> bytes:
    context, parent = span.context, span.parent
    parts = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"), b"\x12\x08", context.span_id.to_bytes(8, "big")]
    if context.trace_state:
        parts.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in context.trace_state.items()).encode()))
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    parts.append(_head(span.name, span.kind))
    if span.start_time:
        parts += (b"\x39", _FIXED64.pack(span.start_time))
    if span.end_time:
        parts += (b"\x41", _FIXED64.pack(span.end_time))
    parts += (_attributes(b"\x4a", span.attributes), _count(b"\x50", span.dropped_attributes),
              _count(b"\x60", span.dropped_events), _count(b"\x70", span.dropped_links))
    message = span.description
    parts += (_field(b"\x7a", (_field(b"\x12", message.encode("utf-8")) if message else b"")
                     + _count(b"\x18", span.status_code)),
              _REMOTE if parent is not None and parent.is_remote else _LOCAL)
    return b"".join(parts)


def encode(spans: Sequence[Span]) -> bytes:
    """An ExportTraceServiceRequest of `spans`, serialized: one ResourceSpans for each recorder (its
    provider's resource, its scope), as the SDK's encoder groups them."""
    grouped: dict[int, tuple[Recorder, list[bytes]]] = {}
    for i, span in enumerate(spans):
        if i and not i % _CHUNK:
            time.sleep(0)  # the GIL to the loop, were it waiting for it
        recorder = span.recorder
        found = grouped.get(id(recorder))
        if found is None:
            found = grouped[id(recorder)] = (recorder, [])
        found[1].append(_field(b"\x12", _span(span)))
    out = []
    for recorder, written in grouped.values():
        resource, scope = recorder.resource, recorder.scope
        head = b"".join((_field(b"\x0a", scope.name.encode("utf-8")) if scope.name else b"",
                         _field(b"\x12", scope.version.encode("utf-8")) if scope.version else b"",
                         _attributes(b"\x1a", scope.attributes)))
        url = scope.schema_url
        body = [_field(b"\x0a", _attributes(b"\x0a", resource.attributes)),
                _field(b"\x12", b"".join((_field(b"\x0a", head), *written,
                                           _field(b"\x1a", url.encode()) if url else b"")))]
        if resource.schema_url:
            body.append(_field(b"\x1a", resource.schema_url.encode()))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


class SpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter (its endpoint, headers, compression, timeout and retries, from
    the same variables), sending what `encode` writes."""

    def export(self, spans: Sequence[Span]) -> SpanExportResult:  # type: ignore[override]
        # The SDK's own steps (its metrics of exports, the size cap, the client that compresses, posts
        # and retries), but for the encoding; an SDK that sends otherwise does it its own way, given
        # the spans in its own form.
        client, metrics = getattr(self, "_client", None), getattr(self, "_metrics", None)
        if client is None or metrics is None or self._shutdown:
            return super().export([span.readable() for span in spans])
        with metrics.export_operation(len(spans)) as result:
            try:
                written = encode(spans)
            except Exception as error:  # noqa: BLE001 - as the SDK does: the batch fails, the exporter lives on
                _logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE
            limit = getattr(self, "_max_request_size", None)
            if limit is not None and 0 < limit < len(written):  # 0: no cap
                _logger.warning("Dropping span batch: serialized size %d bytes exceeds max_request_size %d bytes.",
                                len(written), limit)
                result.error = ValueError(f"a span batch of {len(written)} bytes, over {limit}")
                return SpanExportResult.FAILURE
            sent = client.export(written)
            if not sent.success:
                result.error = sent.error
                if sent.status_code is not None:
                    result.error_attrs = {"http.response.status_code": sent.status_code}
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS
