"""A real OTLP/HTTP trace receiver on 127.0.0.1 (port 0): what an exporter sends, decoded with
opentelemetry-proto into plain dicts a test can assert on.

    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        ...  # a traced run
        spans = receiver.wait_for("invoke_agent flow")
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {0: "unset", 1: "ok", 2: "error"}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind is not None else None


def decode(body: bytes) -> list[dict[str, Any]]:
    """The spans of one ExportTraceServiceRequest, each as a dict."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append({
                    "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None, "kind": KINDS[span.kind],
                    "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                    "status": {"code": STATUS[span.status.code], "message": span.status.message},
                    "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                    "scope": scope_spans.scope.name, "resource": resource})
    return spans


@dataclass
class Receiver:
    url: str = ""
    spans: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, *names: str, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Every span received once spans of all `names` have arrived (flushing this process's tracer)."""
        from heddle.engine import tracing

        deadline = time.monotonic() + timeout
        while True:
            tracing.flush()
            with self.lock:
                seen = {s["name"] for s in self.spans}
                if set(names) <= seen:
                    return list(self.spans)
            if time.monotonic() > deadline:
                raise AssertionError(f"spans {sorted(set(names) - seen)} never arrived; got {sorted(seen)}")
            time.sleep(0.05)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            encoding = (self.headers.get("content-encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            spans = decode(body)
            with receiver.lock:
                receiver.paths.append(self.path)
                receiver.spans.extend(spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    # Polled often: the receiver closes with its test, not up to half a second later.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        from heddle.engine import tracing

        tracing.flush()  # nothing left for an exporter to retry against a closed port
        server.shutdown()
        server.server_close()


def tree(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Spans by name (the last of each name), for assertions on parentage."""
    return {s["name"]: s for s in spans}
