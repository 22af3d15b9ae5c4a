"""Fuzz the running server from its own /openapi.json: no input may yield a 500 or a crash."""

from __future__ import annotations

import re

from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.server.support import fuzz, start_server


def test_no_generated_request_makes_the_server_fail(tmp_path):
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    work = tmp_path / "work"
    # With a session store, so the session routes and fields are fuzzed too.
    server = start_server(tmp_path, "--tools-dir", tools, "--flows-root", flows, "--allow-request-code",
                          "--work-dir", work, "--auth-token", "fuzz", "--session-store", "sqlite",
                          "--session-db", tmp_path / "sessions.db")
    try:
        proc = fuzz(server, tmp_path, "fuzz")
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert "passed" in proc.stdout
        # Every operation of the document was fuzzed, none left out for want of examples.
        counts = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", proc.stdout)
        assert counts is not None and len(set(counts.groups())) == 1, proc.stdout[-3000:]
        with server.client("fuzz") as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/capabilities").json()["runsInFlight"] == 0
        assert list(work.iterdir()) == []
        assert "Traceback" not in server.stderr()
    finally:
        assert server.stop() == 0
