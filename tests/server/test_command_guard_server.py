"""`heddle-server --commands`: a caller's value never becomes an option of a command's program."""

from __future__ import annotations

from pathlib import Path

from tests.support.commands import sort_entry, sort_flow, write_commands
from tests.support.server_thread import threaded_server


def test_a_callers_value_that_would_be_an_option_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    sort_flow(flows / "sort.json")
    commands = write_commands(tmp_path / "commands.json", sort_entry(["{path}"]))
    target = tmp_path / "written"
    # What the server answers, not its process: served from a thread by the command's own entry.
    with threaded_server(tmp_path, "--flows-root", flows, "--commands", commands) as server, \
            server.client() as client:
        response = client.post("/v1/runs", json={"flowPath": "sort.json",
                                                 "inputs": {"path": f"--output={target}"}})
        assert response.status_code != 200 or response.json().get("status") != "completed", response.text
        assert "'path' starts with '-'" in response.text, response.text
        assert not target.exists()
        (tmp_path / "lines.txt").write_text("b\na\n")
        response = client.post("/v1/runs", json={"flowPath": "sort.json",
                                                 "inputs": {"path": str(tmp_path / "lines.txt")}})
        assert response.status_code == 200, response.text
        assert response.json()["outputs"]["stdout"] == "a\nb\n"
    assert not target.exists()
