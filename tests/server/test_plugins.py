"""Plugins loaded once for the whole server: their node types, and encoders as `?protocol=`."""

from __future__ import annotations

from pathlib import Path

from tests.server.support import start_server, wait_gone
from tests.support.server_thread import threaded_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
NODE = EXAMPLES / "custom-node"
MARKDOWN = EXAMPLES / "markdown-encoder" / "plugin" / "plugin.json"


def _parent(pid: int) -> int:
    # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses.
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def plugin_pids(marker: str, below: int) -> list[int]:
    """The processes whose command line holds `marker` started (at any depth) by process `below`: other
    tests running beside this one start the same example plugins."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() not in (entry / "cmdline").read_bytes():
                    continue
                pid = int(entry.name)
                while pid > 1 and pid != below:
                    pid = _parent(pid)
            except (OSError, ValueError, IndexError):
                continue
            if pid == below:
                pids.append(int(entry.name))
    return pids


def test_plugin_node_types_and_an_encoder_protocol(tmp_path):
    server = start_server(tmp_path, "--plugin", NODE / "plugin" / "plugin.json", "--plugin", MARKDOWN,
                          "--tools-dir", NODE / "tools", "--flows-root", NODE)
    try:
        with server.client() as client:
            caps = client.get("/v1/capabilities").json()
            assert caps["protocols"] == ["heddle", "ag-ui", "markdown"]
            assert sorted(p["name"] for p in caps["plugins"]) == ["markdown", "text-stats"]
            assert all("manifest" not in p for p in caps["plugins"])
            body = {"flowPath": "flow.yaml", "inputs": {"text": "Short. Sweet."}}
            for _ in range(2):
                response = client.post("/v1/runs", json=body)
                assert response.status_code == 200, response.text
                assert response.json()["state"]["words"] == 2
            response = client.post("/v1/runs", params={"protocol": "markdown"}, json=body)
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/markdown; charset=utf-8"
            assert response.text.startswith("# Run of `custom-node`") and "TextStats" in response.text
            response = client.post("/v1/runs", params={"protocol": "heddle"}, json=body)
            assert response.headers["content-type"].startswith("text/event-stream")
            assert "event: flow_complete" in response.text
            response = client.post("/v1/runs", params={"protocol": "yaml"}, json=body)
            assert response.status_code == 400
            assert response.json()["error"] == {
                "type": "unknown_protocol",
                "message": "query parameter protocol='yaml': no such protocol; this server has: heddle, ag-ui, markdown"}
            report = client.post("/v1/validate", json={"flowPath": "flow.yaml"}).json()
            assert report["valid"] is True and len(report["plugins"]) == 2
            pids = plugin_pids("stats.py", server.process.pid) + plugin_pids("markdown.py", server.process.pid)
            assert len(pids) == 2  # one process per plugin, shared by every run
    finally:
        assert server.stop() == 0
    assert all(wait_gone(pid, 2.0) for pid in pids)


def test_a_plugin_node_type_without_its_plugin_is_a_400(tmp_path):
    # Served from a thread by the command's own entry (the process with plugins: the test above).
    with threaded_server(tmp_path, "--tools-dir", NODE / "tools", "--flows-root", NODE) as server, \
            server.client() as client:
        response = client.post("/v1/runs", json={"flowPath": "flow.yaml", "inputs": {"text": "x"}})
        assert response.status_code == 400
        assert "unknown component_type 'TextStats'" in response.json()["error"]["message"]
        assert client.get("/v1/capabilities").json()["protocols"] == ["heddle", "ag-ui"]


def test_plugin_settings_are_checked_at_start(tmp_path, capsys):
    from heddle.server.cli import run
    from tests.server.support import run_server_to_exit
    from tests.support.cli import env_with

    proc = run_server_to_exit(tmp_path, "--plugin", MARKDOWN, "--plugin-config", 'MarkdownTranscript={"timings": 3}')
    assert proc.returncode == 2 and "listening" not in proc.stdout
    assert proc.stderr.startswith("error: ") and "timings" in proc.stderr
    # The second refusal through the command's entry function in this process.
    capsys.readouterr()
    status = run(["--port", "0", "--plugin-config", 'MarkdownTranscript={"timings": true}'], env_with())
    out = capsys.readouterr()
    assert status == 2 and "listening" not in out.out and "load the plugin with --plugin MANIFEST" in out.err
