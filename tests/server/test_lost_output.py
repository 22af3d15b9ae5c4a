"""`heddle-server` whose output nobody reads any more still drains and exits on a signal, and
its log lines carry no terminal control sequences."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from heddle.server.serve import _LogLines
from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.server.support import SERVER
from tests.support.cli import env_with


def _invalid_request(port: int) -> None:
    """A request uvicorn cannot parse, which it logs as a warning."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"\x00 not http\r\n\r\n")
        try:
            while sock.recv(1024):
                pass
        except OSError:
            pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_server_whose_output_lost_its_reader_drains_and_exits(tmp_path: Path, sig: int) -> None:
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    read, write = os.pipe()
    try:
        process = subprocess.Popen([str(SERVER), "--port", "0", "--tools-dir", tools, "--flows-root", flows],
                                   stdin=subprocess.DEVNULL, stdout=write, stderr=write, env=env_with(), cwd=tmp_path)
    finally:
        os.close(write)
    try:
        with os.fdopen(read, "rb") as output:
            line = output.readline().decode().strip()
        assert line.startswith("heddle-server listening on http://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        # Nobody reads the pipe now: every line the server writes fails.
        for _ in range(3):
            _invalid_request(port)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}},
                            timeout=30)
        assert answer.status_code == 200 and answer.json()["state"]["x"] == 1
        _invalid_request(port)
        process.send_signal(sig)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_servers_log_lines_are_printable(capsys: pytest.CaptureFixture[str]) -> None:
    handler = _LogLines()
    handler.setFormatter(logging.Formatter("heddle-server: %(message)s"))
    try:
        raise RuntimeError("registry said \x1b]0;pwned\x07\x1b[2Jno")
    except RuntimeError as exc:
        record = logging.LogRecord("heddle.server", logging.ERROR, __file__, 1, "following %s failed: %s",
                                   ("oci://r/\x9b2Japp", exc), exc_info=(type(exc), exc, exc.__traceback__))
    handler.emit(record)
    err = capsys.readouterr().err
    assert "heddle-server: following oci://r/app failed: registry said no\nTraceback" in err
    assert "RuntimeError: registry said no" in err
    assert not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in err), repr(err)

