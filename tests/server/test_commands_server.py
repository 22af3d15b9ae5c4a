"""`heddle-server --commands`: request flows name its commands as tools, a `--bundle` runs its own, and
what a caller or the metrics see of a call holds neither its arguments nor its output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import heddle
from heddle.tools.commands import load_commands
from tests.server.support import metric, sse_frames
from tests.support.commands import day_flow, entry, write_commands
from tests.support.server_thread import threaded_server


def test_request_flows_and_a_bundle_run_the_servers_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, variable in (("cache", "HEDDLE_CACHE_DIR"), ("trust", "HEDDLE_TRUST_DIR"), ("home", "HOME")):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(variable, str(tmp_path / name))
    root = tmp_path / "flows"
    root.mkdir()
    day_flow(root / "day.json")
    commands = write_commands(tmp_path / "commands.json", entry())
    # Both servers from a thread, by the command's own entry: what they answer is the subject
    # (the `heddle-server` process: tests/server/test_routes.py and the rest).
    with threaded_server(tmp_path, "--flows-root", root, "--commands", commands) as server, \
            server.client() as client:
        response = client.post("/v1/runs", json={"flowPath": "day.json", "inputs": {"seconds": 86400}})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"] == {"stdout": "1970-01-02\n"}
        frames = sse_frames(client.post("/v1/runs?stream=true",
                                        json={"flowPath": "day.json", "inputs": {"seconds": 86400}}).text)
        tool_frames = [data for event, data in frames if event in ("tool_call", "tool_result")]
        assert len(tool_frames) == 2 and "86400" not in json.dumps(tool_frames)
        assert "1970-01-02" not in json.dumps(tool_frames)
        assert "day_of" in client.get("/v1/capabilities").json()["tools"]
        metrics = client.get("/metrics").text
        assert metric(metrics, "heddle_tool_calls_total", 'outcome="ok",tool="day_of"') == 2
        revision = load_commands(commands)[0].revision
        assert metric(metrics, "heddle_command_duration_seconds_count",
                      f'command="day_of",exit_code="0",revision="{revision}"') == 2
        assert "1970-01-02" not in metrics
        # A tool sent with a request cannot take a command's name.
        response = client.post("/v1/runs", json={"flowPath": "day.json", "inputs": {"seconds": 1},
                                                 "tools": [{"name": "day_of", "source": "#!/bin/sh\n"}]})
        assert response.status_code == 400

    bundle = heddle.seal(root / "day.json", output=tmp_path / "day.heddle", commands=commands).path
    commands.unlink()
    with threaded_server(tmp_path, "--bundle", bundle, "--allow-unsigned") as server, server.client() as client:
        response = client.post("/v1/runs", json={"inputs": {"seconds": 0}})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"] == {"stdout": "1970-01-01\n"}
