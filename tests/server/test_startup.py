"""What `heddle-server` refuses before it opens a port, and the authentication it enforces."""

from __future__ import annotations

import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.server.support import SERVER, run_server_to_exit, start_server
from tests.support.cli import env_with
from tests.support.server_thread import ThreadedServer, threaded_server


def error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def test_version_and_help_name_every_setting() -> None:
    # Speed is scripts/bench's business; this checks what they say.
    proc = subprocess.run([str(SERVER), "--version"], check=False, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and proc.stdout.strip() == "heddle-server 0.1.0"
    proc = subprocess.run([str(SERVER), "--help"], check=False, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0
    for flag in ("--bundle", "--trust", "--allow-unsigned", "--tools-dir", "--flows-root", "--max-concurrent",
                 "--drain-timeout", "--cors-origin", "--allow-request-code", "--allow-net", "--work-dir",
                 "--mount", "--workspace", "--mount-max-bytes", "--mount-max-entries", "--no-mount-tools",
                 "--llm-default-url", "--safe", "--sandbox", "--allow-read", "--allow-write", "--allow-env",
                 "--deny-net", "--auth-token", "--allowed-host", "--header-timeout", "--body-timeout",
                 "--max-connections", "HEDDLE_AUTH_TOKEN", "HEDDLE_STREAM", "HEDDLE_LLM_DEFAULT_KEY",
                 "--session-store", "--session-db", "--session-dir", "--session-key", "HEDDLE_SESSION_KEY"):
        assert flag in proc.stdout, flag
    assert "--durable" not in proc.stdout  # a server's runs are durable by their session store, not a flag


def refused_in_process(args: list[object], env: dict[str, str] | None,
                       capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(status, stdout, stderr) of `heddle-server ARGS` run by its own entry point, in this process."""
    from heddle.server.cli import run

    status = run(["--port", "0", *[str(a) for a in args]], env_with(env))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_bad_start_up_settings_fail_with_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")
    monkeypatch.chdir(tmp_path)
    # A refusal that got past the work-dir check would have pointed tempfile there.
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    cases: list[tuple[tuple[list[object], dict[str, str] | None], str]] = [
        ((["--port", "http"], None), "--port: 'http' is not a whole number"),
        ((["--tools-dir", tmp_path / "nope"], None), f"--tools-dir {tmp_path / 'nope'}: does not exist"),
        ((["--flows-root", tmp_path / "file"], None), "is not a folder"),
        ((["--trust", tmp_path / "k.pub"], None), "--trust applies only to --bundle"),
        ((["--allow-unsigned", "--data-dir", tmp_path], None), "--allow-unsigned, --data-dir apply only to --bundle"),
        ((["--bundle", tmp_path / "a.heddle", "--flows-root", tmp_path], None),
         "--flows-root cannot be used with --bundle"),
        ((["--tool-timeout", "0"], None), "--tool-timeout 0: must be at least 1"),
        ((["--bundle", tmp_path / "a.heddle", "--tools-dir", tmp_path], None),
         "--tools-dir cannot be used with --bundle"),
        ((["--max-concurrent", "0"], None), "--max-concurrent 0: must be at least 1"),
        ((["--max-tool-rounds", "0"], None), "--max-tool-rounds 0: must be at least 1"),
        ((["--deny-net"], None), "--deny-net only works with --safe"),
        ((["--sandbox", "chroot", "--safe"], None), "--sandbox 'chroot': unknown"),
        ((["--allow-net", "http://x"], None), "--allow-net 'http://x'"),
        ((["--llm-default-url", "ftp://x"], None), "--llm-default-url 'ftp://x'"),
        ((["--mount", tmp_path / "nope"], None), "nope"),
        (([], {"HEDDLE_STREAM": "yes"}), "HEDDLE_STREAM='yes': use 1"),
        (([], {"HEDDLE_AUTH_TOKEN": " "}), "HEDDLE_AUTH_TOKEN is set but empty"),
        ((["--work-dir", tmp_path / "file" / "sub"], None), "--work-dir"),
        ((["--max-connections", "0"], None), "--max-connections 0: must be at least 1"),
        ((["--header-timeout", "0"], None), "--header-timeout 0: must be at least 1"),
        ((["--body-timeout", "1.5"], None), "--body-timeout: '1.5' is not a whole number of milliseconds"),
        ((["--allowed-host", "http://api.example.com"], None), "--allowed-host 'http://api.example.com'"),
        ((["--allowed-host", "api.example.com:8443"], None), "(no scheme or port)"),
        ((["--cors-origin", "https://app.example.com/page"], None), "(scheme, host and port only)"),
    ]
    # The real process for a flag's refusal and an environment one; the rest are the same
    # checks reached through the entry point in-process, without a start-up each.
    in_a_process = {0, 15}
    for n, ((args, env), expected) in enumerate(cases):
        if n in in_a_process:
            proc = run_server_to_exit(tmp_path, *args, env=env)
            status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            status, stdout, stderr = refused_in_process(args, env, capsys)
        assert status == 2, (args, stderr)
        lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and expected in lines[0], (args, stderr)
        assert "listening" not in stdout


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_server_to_exit(tmp_path, "--port", port)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in error_lines(proc)[0]


def test_a_non_loopback_host_warns(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--host", "0.0.0.0")
    try:
        assert "warning: --host 0.0.0.0 is not a loopback address and there is no authentication" in server.stderr()
    finally:
        assert server.stop() == 0
    # What decides the warnings, as `heddle-server` runs it before it prints them: the process
    # above shows they reach stderr.
    assert start_up_warnings(["--host", "0.0.0.0"], {})[0].startswith("--host 0.0.0.0 is not a loopback address")
    assert start_up_warnings(["--host", "127.0.0.1"], {}) == []


def start_up_warnings(args: list[str], environ: dict[str, str]) -> list[str]:
    from heddle.server.cli import config_from
    from heddle.server.config import DEFAULT_MAX_CONNECTIONS, check_config
    from heddle.server.connections import connection_cap

    config = config_from(["--port", "0", *args], environ)
    lowered = connection_cap(config.max_connections, DEFAULT_MAX_CONNECTIONS, config.max_concurrent)[1]
    return [*check_config(config), *([lowered] if lowered else [])]


def _served_echo(root: Path) -> tuple[Path, Path]:
    tools = write_tools(root / "tools", {"echo": ECHO})
    flows = root / "flows"
    flows.mkdir()
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    return tools, flows


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    """A server behind the token s3cret (from HEDDLE_AUTH_TOKEN) that also answers one CORS origin:
    the bearer and CORS tests read from it without changing it, so one serves both. From a thread,
    by the command's own entry (a guarded `heddle-server` process: tests/server/test_bundle.py's,
    CORS from one: tests/server/test_browsers.py's)."""
    root = tmp_path_factory.mktemp("guarded")
    tools, flows = _served_echo(root)
    with threaded_server(root, "--tools-dir", tools, "--flows-root", flows, "--cors-origin",
                         "https://app.example.com", env={"HEDDLE_AUTH_TOKEN": "s3cret"}) as server:
        yield server


def test_bearer_token_guards_every_route_but_the_probes(guarded: ThreadedServer) -> None:
    from heddle.server.cli import config_from

    # The shared server takes its token from HEDDLE_AUTH_TOKEN; the flag settles the same setting
    # (tests/server/test_bundle.py's server is guarded by the flag, in a process).
    def token(args: list[str], environ: dict[str, str]) -> str | None:
        return config_from(["--port", "0", *args], environ).auth_token

    assert token(["--auth-token", "s3cret"], {}) == token([], {"HEDDLE_AUTH_TOKEN": "s3cret"}) == "s3cret"
    server = guarded
    with server.client() as anonymous, server.client("s3cret") as client, \
            server.client("s3cret-not") as wrong:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        for method, path in (("GET", "/metrics"), ("GET", "/v1/capabilities"), ("GET", "/openapi.json"),
                             ("POST", "/v1/validate"), ("POST", "/v1/runs"), ("GET", "/nowhere")):
            for who in (anonymous, wrong):
                response = who.request(method, path, json={"flowPath": "echo.json", "inputs": {"x": 1}})
                assert response.status_code == 401, (method, path)
                assert response.json()["error"]["type"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith("Bearer")
        assert anonymous.post("/v1/runs", headers={"Authorization": "Basic s3cret"}).status_code == 401
        response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}})
        assert response.status_code == 200 and response.json()["state"] == {"x": 1}
        assert client.get("/metrics").status_code == 200
        assert client.get("/nowhere").status_code == 404
        doc = client.get("/openapi.json").json()
        assert doc["security"] == [{"bearer": []}]


def test_cors_origins_are_answered(guarded: ThreadedServer) -> None:
    with guarded.client() as client:
        preflight = client.options("/v1/runs", headers={"Origin": "https://app.example.com",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "authorization"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example.com"
        response = client.get("/healthz", headers={"Origin": "https://app.example.com"})
        assert response.headers["access-control-allow-origin"] == "https://app.example.com"
        response = client.get("/healthz", headers={"Origin": "https://evil.example.com"})
        assert response.status_code == 403 and "access-control-allow-origin" not in response.headers
