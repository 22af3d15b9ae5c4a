"""`heddle model serve`: script files, the URL line, recording, routes, stopping."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.errors import UsageError
from heddle.model.scripted import ScriptedModel, ScriptError, load_script
from tests.support.cli_inproc import heddle_inproc
from tests.support.scripted_model import (
    scripted_model,
    serve_command,
    start_scripted_model,
    stop,
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ script files

def test_json_and_yaml_scripts_load_the_same(tmp_path: Path) -> None:
    entries = [{"content": "hi"}, {"tool_calls": [{"name": "echo", "arguments": {"message": "ä"}}]},
               {"content": "both", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}]
    as_json = write(tmp_path, "s.json", json.dumps(entries))
    as_yaml = write(tmp_path, "s.yaml", """
- content: hi
- tool_calls:
    - name: echo
      arguments: {message: ä}
- content: both
  tool_calls:
    - {name: add, arguments: {a: 1, b: 2}}
""")
    assert load_script(as_json) == entries == load_script(as_yaml)


def test_empty_script_is_allowed(tmp_path: Path) -> None:
    assert load_script(write(tmp_path, "s.json", "[]")) == []


@pytest.mark.parametrize(("text", "fault"), [
    ('{"content": "hi"}', "a model script is a list of answers, got an object"),
    ('["hi"]', "entry 0: an answer is an object"),
    ('[{"content": "a"}, {"text": "b"}]', "entry 1: unknown key 'text'"),
    ('[{}]', "entry 0: empty answer"),
    ('[{"content": 42}]', "entry 0: 'content' must be a string, got a number"),
    ('[{"tool_calls": []}]', "entry 0: 'tool_calls' must be a non-empty list"),
    ('[{"tool_calls": [{"name": "echo"}]}]', "entry 0: tool_calls[0]: missing 'arguments'"),
    ('[{"tool_calls": [{"arguments": {}}]}]', "entry 0: tool_calls[0]: missing 'name'"),
    ('[{"tool_calls": [{"name": "", "arguments": {}}]}]', "entry 0: tool_calls[0]: 'name' must be"),
    ('[{"tool_calls": [{"name": "e", "arguments": "{}"}]}]', "'arguments' must be an object"),
    ('[{"tool_calls": [{"name": "e", "arguments": {}, "id": "x"}]}]', "unknown key 'id'"),
    ('[{"content": "a", "content": "b"}]', "not valid JSON (duplicate key 'content')"),
    ('[{"content": "a"', "not valid JSON"),
])
def test_bad_json_scripts_name_the_file_and_entry(tmp_path: Path, text: str, fault: str) -> None:
    path = write(tmp_path, "script.json", text)
    with pytest.raises(ScriptError) as info:
        load_script(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and fault in message and "\n" not in message
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "script.yaml", "- content: ok\n- content: [unclosed\n")
    with pytest.raises(ScriptError, match=r"script\.yaml: line \d+, column \d+ is not valid YAML: "):
        load_script(path)


def test_yaml_is_read_within_the_documents_caps(tmp_path: Path) -> None:
    path = write(tmp_path, "deep.yaml", "[" * 200 + "]" * 200)
    with pytest.raises(ScriptError, match=r"deep\.yaml: nests deeper than \d+ levels"):
        load_script(path)


def test_yaml_values_json_cannot_hold_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "script.yml", "- tool_calls:\n  - {name: e, arguments: {when: 2024-01-01}}\n")
    with pytest.raises(ScriptError, match="entry 0: not representable as JSON"):
        load_script(path)


def test_missing_script_file(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="no such script file"):
        load_script(tmp_path / "nope.yaml")


# ------------------------------------------------------------------ the server process

def test_prints_one_url_line_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    model = start_scripted_model([{"content": "hi"}], tmp_path)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", model.url)
    assert model.port != 0
    model.process.terminate()
    assert model.process.wait(timeout=10) == 0
    assert model.process.stdout is not None and model.process.stdout.read() == b""
    stop(model.process)
    assert model.stderr() == ""


def test_sigint_stops_it_cleanly_too(tmp_path: Path) -> None:
    model = start_scripted_model([], tmp_path)
    model.process.send_signal(signal.SIGINT)
    assert model.process.wait(timeout=10) == 0
    stop(model.process)
    assert model.stderr() == ""


def test_yaml_script_fixed_port_and_every_request_recorded_as_a_json_line(tmp_path: Path) -> None:
    # One process for the three command-line facts: --script YAML, --port N and --record FILE.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = write(tmp_path, "script.yaml", "- content: from yaml\n- content: b\n")
    with scripted_model(script, tmp_path, ["--port", str(port)]) as m:
        assert m.url == f"http://127.0.0.1:{port}/v1"
        answer = httpx.post(m.url + "/chat/completions",
                            json={"model": "x", "messages": [{"role": "user", "content": "é"}]},
                            headers={"authorization": "Bearer t"}).json()
        httpx.post(m.url + "/chat/completions", content=b"not json")
        lines = m.record_path.read_text(encoding="utf-8").splitlines()
    assert answer["choices"][0]["message"]["content"] == "from yaml"
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert set(first) == {"path", "headers", "body"}
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == "Bearer t"
    assert first["body"] == {"model": "x", "messages": [{"role": "user", "content": "é"}]}
    assert second["body"] == {"_unparsed": "not json"}


def test_answers_streamed_when_asked() -> None:
    # The stream's shape is the app's (served in-process); the process serving it is tested above.
    async def ask() -> httpx.Response:
        app = ScriptedModel([{"content": "Hi!"}], loop=False, log=lambda _line: None)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://model") as http:
            return await http.post("/v1/chat/completions", json={"stream": True})

    response = asyncio.run(ask())
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""}, {"content": "H"}, {"content": "i!"}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert {c["id"] for c in chunks} == {"chatcmpl-0"}


def test_other_routes_are_404_and_an_exhausted_script_is_500(tmp_path: Path) -> None:
    with scripted_model([{"content": "only"}], tmp_path) as m:
        models = httpx.get(m.url + "/models")
        embeddings = httpx.post(m.url + "/embeddings", json={})
        # The misrouted POST used up entry 0, as the conformance runner's model does.
        exhausted = httpx.post(m.url + "/chat/completions", json={})
        assert len(m.requests()) == 2
        log = m.stderr().splitlines()
    assert models.status_code == 404 and "no route GET /v1/models" in models.json()["error"]["message"]
    assert embeddings.status_code == 404 and embeddings.json() == {"error": {"message": "no route /v1/embeddings"}}
    assert exhausted.status_code == 500
    assert exhausted.json() == {"error": {"message": "the script has no more responses"}}
    assert len(log) == 1 and "request 2 found the script's 1 answer(s) used up" in log[0] and "--loop" in log[0]


def test_loop_repeats_the_script_and_request_numbers_keep_counting() -> None:
    logged: list[str] = []

    async def ask(app: ScriptedModel, times: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://model") as http:
            return [await http.post("/v1/chat/completions", json={}) for _ in range(times)]

    answers = asyncio.run(ask(ScriptedModel([{"content": "a"}, {"content": "b"}], loop=True, log=logged.append), 5))
    assert [r.json()["choices"][0]["message"]["content"] for r in answers] == list("ababa")
    assert [r.json()["id"] for r in answers] == [f"chatcmpl-{i}" for i in range(5)]
    # An empty script has nothing to repeat: still a 500, still said once per request.
    [empty] = asyncio.run(ask(ScriptedModel([], loop=True, log=logged.append), 1))
    assert empty.status_code == 500 and len(logged) == 1


def run_serve(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*serve_command(), *args], check=False, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, cwd=tmp_path)


def test_a_bad_script_is_a_one_line_error_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, "script.json", '[{"content": "ok"}, {"tool_calls": [{"name": "e"}]}]')
    record = tmp_path / "requests.jsonl"
    proc = run_serve(["--script", str(path), "--record", str(record)], tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "script.json: entry 1: tool_calls[0]: missing 'arguments'" in proc.stderr
    assert not record.exists()


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    path = write(tmp_path, "script.json", "[]")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = run_serve(["--script", str(path), "--port", str(taken.getsockname()[1])], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "cannot listen on 127.0.0.1:" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_record_file_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Through the command's entry function: the two refusals above show one from a process.
    path = write(tmp_path, "script.json", "[]")
    rc, out, err = heddle_inproc(capsys, "model", "serve", "--script", path,
                                 "--record", tmp_path / "no" / "such" / "dir.jsonl")
    assert rc == 2 and out == ""
    assert "dir.jsonl: cannot open the record file" in err


def test_the_cli_module_imports_only_typer_and_the_stdlib() -> None:
    heavy = ["httpx", "starlette", "uvicorn", "yaml", "pydantic", "zstandard", "cryptography", "jsonschema"]
    module = Path(__file__).resolve().parents[2] / "heddle" / "cli" / "model.py"
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('heddle_cli_model', {str(module)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run([*serve_command()[:1], "-c", code], check=False, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    loaded: list[Any] = json.loads(proc.stdout)
    assert loaded == []
