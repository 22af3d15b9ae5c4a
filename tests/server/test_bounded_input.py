"""A real heddle-server whose flows talk to misbehaving HTTP servers written here: a RemoteTool
whose answer is a compression bomb (a few KiB that decode to gigabytes) and a model whose streamed
answer never ends. Each run fails with one line naming the source and the cap (HTTP 502), and the
server's memory stays within 50 MiB of where it started."""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.server.support import start_server
from tests.support.bombs import zstd_bomb
from tests.support.flows import FlowDoc, llm_config, prop

MiB = 1024 * 1024


def _stacked_zstd() -> bytes:
    """ "Content-Encoding: zstd, zstd": a zstd frame of a zstd frame of 16 GiB of zeros, a few KiB."""
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(zstd_bomb(16 << 30))


BOMBS: dict[str, tuple[str, bytes]] = {}


class Misbehaving(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/small":
            self._send(b"fine", "text/plain")
            return
        coding, body = BOMBS[self.path]
        self._send(body, "application/json", coding)

    def do_POST(self) -> None:
        # An OpenAI-compatible endpoint whose streamed answer never ends.
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        event = json.dumps({"choices": [{"index": 0, "delta": {"content": "la " * 2000}}]})
        chunk = f"data: {event}\n\n".encode() * 16
        try:
            while True:
                self.wfile.write(chunk)
        except OSError:
            pass

    def _send(self, body: bytes, kind: str, coding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", kind)
        if coding:
            self.send_header("content-encoding", coding)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    BOMBS.update({
        "/zstd": ("zstd", zstd_bomb(2 << 30)),
        "/gzip": ("gzip", zlib.compress(bytes(256 * MiB), 1, wbits=31)),
        "/stacked": ("zstd, zstd", _stacked_zstd()),
    })
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _remote_flow(flows: Path, name: str, url: str) -> None:
    tool = {"component_type": "RemoteTool", "id": f"t-{name}", "name": "fetch", "description": "fetches",
            "url": url, "http_method": "GET", "inputs": [], "outputs": [prop("x")]}
    f = FlowDoc(name)
    s = f.start([])
    t = f.tool_node("call", tool)
    e = f.end([prop("x")])
    f.control(s, t)
    f.control(t, e)
    f.data(t, "x", e, "x")
    f.write(flows / f"{name}.json")


def _model_flow(flows: Path, url: str) -> None:
    f = FlowDoc("endless")
    s = f.start(["query"])
    a = f.agent("agent", llm_config(url))
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    f.data(s, "query", a, "query")
    f.data(a, "result", e, "result")
    f.write(flows / "endless.json")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_bombs_and_endless_answers_fail_in_one_line_and_leave_the_memory_as_it_was(tmp_path: Path,
                                                                                   upstream: str) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    _remote_flow(flows, "small", upstream + "/small")
    for name in ("zstd", "gzip", "stacked"):
        _remote_flow(flows, name, f"{upstream}/{name}")
    _model_flow(flows, upstream)
    server = start_server(tmp_path, "--flows-root", flows)
    try:
        with server.client(timeout=60) as client:
            # Warmed up: the modules a RemoteTool run loads are loaded before the baseline.
            ok = client.post("/v1/runs", json={"flowPath": "small.json", "inputs": {}})
            assert ok.status_code == 200 and ok.json()["state"]["x"] == "fine", ok.text
            before = _rss_kib(server.process.pid)
            for _ in range(2):
                for name in ("zstd", "gzip", "stacked"):
                    response = client.post("/v1/runs", json={"flowPath": f"{name}.json", "inputs": {}})
                    assert response.status_code == 502, response.text
                    message = response.json()["error"]["message"]
                    assert message.startswith(f"tool 'fetch': GET {upstream}/{name}: the answer is over 16 MiB once "
                                              "decoded (raise --max-response-bytes"), message
                    assert "\n" not in message
                response = client.post("/v1/runs", json={"flowPath": "endless.json", "inputs": {"query": "hi"}})
                assert response.status_code == 502, response.text
                message = response.json()["error"]["message"]
                assert "the answer is over 16 MiB once decoded" in message and "--max-response-bytes" in message
                assert "\n" not in message
            after = _rss_kib(server.process.pid)
            assert client.get("/healthz").status_code == 200
    finally:
        server.stop()
    assert after - before < 50 * 1024, (before, after)
    assert "Traceback" not in server.stderr(), server.stderr()
