"""Text from outside heddle reaches the terminal without control sequences: a tool's stderr and
output, a model's error body, a registry's error body, a plugin's lines, through the `heddle` command
(a real process's bytes for a tool's; the rest by the same entry function in-process); JSON on stdout
keeps every value exactly, escaped."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from heddle.textsafe import printable, printable_json, write_line
from tests.model.vendor import Vendor
from tests.support.cli import BIN, env_with
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc, llm_config, server_tool, write_tool

# Sets the window title, clears the screen, a C1 CSI that clears it too, a right-to-left override.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b2J\u202e"
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def controls(data: bytes) -> list[str]:
    """Every character of `data` a terminal would act on, but newline and tab."""
    text = data.decode("utf-8")
    return [repr(c) for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c in BIDI]


def heddle_bytes(*args: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(BIN / "heddle"), *map(str, args)], check=False, capture_output=True,
                          env=env_with(), stdin=subprocess.DEVNULL, timeout=60)


def heddle_bytes_here(capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess[bytes]:
    """`heddle_bytes` by the CLI's entry function in this process: the same lines on the same streams
    (the first run below is the real process's bytes)."""
    rc, out, err = heddle_inproc(capsys, *args)
    return subprocess.CompletedProcess(["heddle", *map(str, args)], rc, out.encode(), err.encode())


@pytest.mark.parametrize(("given", "shown"), [
    ("plain\ttext\nkept", "plain\ttext\nkept"),
    ("a\x1b]0;title\x07b", "ab"),
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
    ("a\x1b[2Jb\x1b[31;1mc\x1b[0m", "abc"),
    ("a\x9b2Jb\x9d0;t\x9cc", "abc"),
    ("a\x1bPq#0\x1b\\b", "ab"),
    ("a\x1b(Bb\x1b7c", "abc"),
    ("a\r\x08\x00\x7f\x85b", "ab"),
    (f"a{BIDI}b", "ab"),
    ("unterminated \x1b]0;title", "unterminated 0;title"),
])
def test_printable_removes_sequences_and_controls(given: str, shown: str) -> None:
    assert printable(given) == shown


def test_printable_json_keeps_the_value_and_escapes_what_json_leaves_raw() -> None:
    value = {"text": f"x{HOSTILE}\x7f\x85y", "n": 1}
    text = printable_json(json.dumps(value, ensure_ascii=False))
    assert not controls(text.encode()) and json.loads(text) == value
    # json itself escapes C0: ESC reaches stdout as the six characters \u001b
    assert "\\u001b]0;pwned" in text


def test_a_line_whose_reader_has_gone_is_dropped_for_good() -> None:
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as stream:
        for _ in range(3):
            write_line(stream, "x" * 100_000)  # fails as its reader has gone, then lands in /dev/null
        stream.write("after")
    write_line(None, "no stderr at all")


def _flow(tmp_path: Path, name: str, *tools: str) -> Path:
    f = FlowDoc(name)
    start = previous = f.start(["x"])
    end = f.end([f"{t}_said" for t in tools])
    for tool in tools:
        node = f.tool_node(tool, server_tool(tool, ["x"], [f"{tool}_said"]))
        f.control(previous, node)
        f.data(start, "x", node, "x")
        previous = node
    f.control(previous, end)
    return f.write(tmp_path / f"{name}.json")


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    folder = tmp_path / "tools"
    said = json.dumps(f"it says {HOSTILE}done")
    write_tool(folder, "shout", f"sys.stderr.write({said} + '\\n')\nout = {{'shout_said': {said}}}")
    write_tool(folder, "fail", f"sys.stderr.write('disk full ' + {said} + '\\n')\nsys.exit(3)")
    return folder


def test_a_tools_output_and_stderr_reach_the_terminal_without_controls(tmp_path: Path, tools: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # The tool's output in the event stream (stdout) and on the --verbose lines (stderr).
    shout = _flow(tmp_path, "shout", "shout")
    proc = heddle_bytes("run", shout, "-t", tools, "--input", '{"x": "1"}', "--protocol", "heddle", "-v")
    assert proc.returncode == 0, proc.stderr
    assert not controls(proc.stdout) and not controls(proc.stderr), (proc.stdout, proc.stderr)
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    said = [e["output"]["shout_said"] for e in events if e.get("type") == "tool_result"]
    assert said == [f"it says {HOSTILE}done"]  # exactly what the tool printed, escaped on the way
    assert b"tool shout ok" in proc.stderr

    # A tool that fails: its stderr in the node's error (--verbose) and in the error line.
    failing = _flow(tmp_path, "failing", "shout", "fail")
    proc = heddle_bytes_here(capsys, "run", failing, "-t", tools, "--input", '{"x": "1"}', "-v")
    assert proc.returncode == 1
    assert not controls(proc.stderr), proc.stderr
    error = [line for line in proc.stderr.decode().splitlines() if line.startswith("error: ")]
    assert error and "exited with status 3: disk full it says done" in error[-1], proc.stderr
    assert "pwned" not in error[-1]


def test_a_models_error_body_reaches_the_terminal_without_controls(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    f = FlowDoc("ask")
    start, end = f.start(["q"]), f.end(["generated_text"])
    with Vendor([400], error_body=f"bad request {HOSTILE} try again") as vendor:
        llm = f.llm("ask", llm_config(vendor.url), "{{q}}", inputs=["q"])
        f.control(start, llm)
        f.control(llm, end)
        proc = heddle_bytes_here(capsys, "run", f.write(tmp_path / "ask.json"), "--input", '{"q": "hi"}', "-v")
    assert proc.returncode == 1
    assert not controls(proc.stderr), proc.stderr
    assert b"bad request  try again" in proc.stderr


@contextmanager
def _registry_that_refuses(body: dict[str, Any]) -> Iterator[str]:
    """An OCI registry on 127.0.0.1 that answers every request 404 with `body`."""
    data = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def do_GET(self) -> None:
            self._answer(with_body=True)

        def _answer(self, *, with_body: bool) -> None:
            self.send_response(404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if with_body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_registrys_error_body_reaches_the_terminal_without_controls(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    errors = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": f"no such tag {HOSTILE} here"}]}
    with _registry_that_refuses(errors) as address:
        proc = heddle_bytes_here(capsys, "pull", f"oci://{address}/agents/app:1", "-o", tmp_path / "app.heddle",
                                 "--cache-dir", tmp_path / "cache")
    assert proc.returncode != 0
    assert not controls(proc.stderr), proc.stderr
    assert b"no such tag  here" in proc.stderr


def test_a_plugins_log_lines_and_stderr_reach_the_terminal_without_controls(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tests.plugins.support import make_plugin, middleware, tool_chain_flow

    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    hostile = json.dumps(HOSTILE)
    code = f'''
import os, sys
@plugin.before("Loud", "toolCall")
def h(call):
    call.log("about to " + {hostile} + "call", level="info")
    sys.stderr.write("plugin broke " + {hostile} + "badly\\n")
    sys.stderr.flush()
    os._exit(1)
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Loud", "toolCall.before")], code=code)
    proc = heddle_bytes_here(capsys, "run", flow, "-t", tools, "--plugin", plugin, "--verbose")
    assert proc.returncode == 1
    assert not controls(proc.stderr), proc.stderr
    assert b"plugin p info: about to call" in proc.stderr
    assert b"plugin broke badly" in proc.stderr


def test_a_wait_asked_on_a_terminal_shows_its_question_without_controls(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.cli.waiting import ask
    from heddle.engine.journal import WaitingFor

    answers = iter(["", "a reply"])
    monkeypatch.setattr("builtins.input", lambda: next(answers))
    answer = ask(WaitingFor("message", "ask", prompt=f"What now? {HOSTILE}"), [f"the model said {HOSTILE}"])
    assert answer.message == "a reply"
    err = capsys.readouterr().err
    assert "the model said \nask: What now? \n> > " == err
    approval = iter(["y"])
    monkeypatch.setattr("builtins.input", lambda: next(approval))
    ask(WaitingFor("approval", "pay", tool="pay", arguments={"memo": f"x{HOSTILE}\x85y"}))
    err = capsys.readouterr().err
    # The arguments are shown whole: what a terminal would act on is escaped, not hidden.
    assert not controls(err.encode()), err
    assert '"memo": "x\\u001b]0;pwned\\u0007\\u001b[2J\\u009b2J\\u202e\\u0085y"' in err, err
