"""A stand-in for a model vendor: a real HTTP server on 127.0.0.1 that misbehaves on cue.

Each request takes the next step of the plan; once the plan is used up every request
succeeds with ANSWER (streamed or buffered, as the request asks).

Steps: an int (answer with that status and an error body), "drop" (close without answering),
"break" (start streaming, then cut the connection mid-body), "hang" (never answer; note
when the client goes away).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "Hello from the vendor"


class Vendor:
    def __init__(self, plan: list[int | str] | None = None, *, error_body: str | None = None) -> None:
        self.plan = list(plan or [])
        self.error_body = error_body
        self.attempts: list[dict[str, Any]] = []
        self.got_request = threading.Event()
        self.disconnected = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown, and so each test, quick.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> Vendor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, record: dict[str, Any]) -> int | str:
        with self._lock:
            self.attempts.append(record)
            return self.plan.pop(0) if self.plan else "ok"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        vendor = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw)
                step = vendor._next({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                     "body": body})
                if isinstance(step, int):
                    text = vendor.error_body or json.dumps({"error": {"message": f"vendor says {step}"}})
                    self._send(step, "application/json", text.encode())
                elif step == "drop":
                    self.close_connection = True
                elif step == "hang":
                    vendor.got_request.set()
                    self.connection.settimeout(30)
                    try:
                        while self.connection.recv(1024):
                            pass
                    except OSError:
                        pass
                    vendor.disconnected.set()
                    self.close_connection = True
                elif step == "break":
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    event = b"data: " + json.dumps(_chunk({"content": "Hel"})).encode() + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.write(b"ff\r\npartial")  # a chunk that never completes
                    self.wfile.flush()
                    self.close_connection = True
                elif body.get("stream"):
                    events = [_chunk({"role": "assistant"}), _chunk({"content": ANSWER[:5]}),
                              _chunk({"content": ANSWER[5:]}), _chunk({}, "stop")]
                    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
                    self._send(200, "text/event-stream", data + b"data: [DONE]\n\n")
                else:
                    answer = {"choices": [{"index": 0, "finish_reason": "stop",
                                           "message": {"role": "assistant", "content": ANSWER}}]}
                    self._send(200, "application/json", json.dumps(answer).encode())

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
