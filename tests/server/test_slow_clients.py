"""Slow and idle clients cannot hold the server: headers and bodies have deadlines, and open
connections a cap, so a normal request is always answered or cleanly refused."""

from __future__ import annotations

import json
import socket
import time

import httpx

from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.server.support import run_server_to_exit, start_server

# Every wait below is bounded by this; none of them measures how long something took.
PATIENCE_S = 10.0


def connect(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    if data:
        sock.sendall(data)
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or PATIENCE_S passes: a failure)."""
    received = b""
    with sock:
        while True:
            piece = sock.recv(65536)
            if not piece:
                return received
            received += piece


def status_and_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def echo_server(tmp_path, *args, wrap: tuple[str, ...] = ()):
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir(exist_ok=True)
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    return start_server(tmp_path, "--tools-dir", tools, "--flows-root", flows, *args, wrap=wrap)


def run_once(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}}, timeout=PATIENCE_S)


def test_half_sent_requests_are_closed_at_the_header_and_body_deadlines(tmp_path):
    server = echo_server(tmp_path, "--header-timeout", "300", "--body-timeout", "300")
    try:
        port = server.port
        slow = [connect(port, b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty") for _ in range(40)]
        slow += [connect(port, b"GE") for _ in range(5)] + [connect(port) for _ in range(5)]
        body_short = connect(port, b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 100\r\n\r\n{\"inputs\": ")
        # While they hang on, a normal client is served.
        response = run_once(server.url)
        assert response.status_code == 200 and response.json()["state"] == {"x": 1}
        for sock in slow:
            status, error = status_and_error(read_to_close(sock))
            assert status == 408 and error["type"] == "request_timeout"
            assert "--header-timeout 300 ms" in error["message"]
        status, error = status_and_error(read_to_close(body_short))
        assert status == 408 and "body did not arrive within --body-timeout 300 ms" in error["message"]
        # A trickle of header bytes does not push the deadline back.
        trickle = connect(port, b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        trickle.settimeout(0.1)
        closed = False
        for _ in range(int(PATIENCE_S / 0.1)):
            try:
                trickle.sendall(b"a")
                closed = trickle.recv(4096).startswith(b"HTTP/1.1 408")
            except TimeoutError:
                continue
            except OSError:
                closed = True
            if closed:
                break
        trickle.close()
        assert closed
        assert run_once(server.url).status_code == 200
        assert "Traceback" not in server.stderr()
    finally:
        assert server.stop() == 0


def test_connections_past_the_cap_are_refused_at_once_not_left_hanging(tmp_path):
    server = echo_server(tmp_path, "--max-connections", "4", "--header-timeout", "60000")
    try:
        idle = [connect(server.port) for _ in range(10)]
        # The first four hold every slot; the others, and the normal request, get 503 at once.
        try:
            response = httpx.get(f"{server.url}/healthz", timeout=PATIENCE_S)
        except httpx.TransportError as exc:  # pragma: no cover - a reset would be a failure, said plainly
            raise AssertionError(f"the request past the cap was not answered: {exc!r}") from None
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["type"] == "too_many_connections"
        assert "--max-connections 4" in response.json()["error"]["message"]
        for sock in idle[4:]:
            assert status_and_error(read_to_close(sock))[0] == 503
        for sock in idle[:4]:
            sock.close()
        deadline = time.monotonic() + PATIENCE_S
        while (status := run_once(server.url).status_code) == 503 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert status == 200
    finally:
        assert server.stop() == 0


LOW_FILES = ("sh", "-c", 'ulimit -n 256 && exec "$@"', "sh")


def test_the_connection_cap_fits_the_open_file_limit(tmp_path):
    proc = run_server_to_exit(tmp_path, "--max-connections", "300", wrap=LOW_FILES)
    assert proc.returncode == 2
    assert "error: --max-connections 300: the open-file limit is 256 (ulimit -n)" in proc.stderr
    server = echo_server(tmp_path, "--header-timeout", "500", wrap=LOW_FILES)
    try:
        assert "warning: --max-connections lowered from 512 to 160: the open-file limit is 256" in server.stderr()
        assert httpx.get(f"{server.url}/v1/capabilities").json()["limits"]["maxConnections"] == 160
        slow = [connect(server.port, b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(300)]
        # More half-sent requests than descriptors: a normal run is refused or served, never left to time out.
        assert run_once(server.url).status_code in (200, 503)
        for sock in slow:
            assert status_and_error(read_to_close(sock))[0] in (408, 503)
        assert run_once(server.url).status_code == 200
    finally:
        assert server.stop() == 0
