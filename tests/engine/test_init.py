"""`heddle init DIR` writes a starter that runs exactly as printed, again and again."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from heddle.starter import MODEL, write_starter
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.threaded_model import threaded_model


def _commands(printed: str) -> list[list[str]]:
    return [shlex.split(line) for line in printed.splitlines() if line.strip().startswith("heddle ")]


def test_init_writes_a_starter_that_runs_twice_as_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # The model starts first on a port the OS picks, and `init --port` takes that port: no fixed
    # number, and no window in which another process could take it. The model is the scripted
    # app `heddle model serve` runs, on the starter's script, served from a thread: the subject
    # here is `heddle init` and the `heddle run` it prints.
    script = tmp_path / "model.yaml"
    script.write_text(MODEL, encoding="utf-8")
    with threaded_model(script, loop=True) as model:
        port = urlsplit(model.url).port
        target = tmp_path / "starter"
        # Through the command's entry in-process: `heddle init` as a process is the refusal below.
        rc, printed, err = heddle_inproc(capsys, "init", target, "--port", port)
        assert rc == 0, err
        serve, run = _commands(printed)
        # The printed server command serves what this test serves, on the starter's own script.
        assert serve == ["heddle", "model", "serve", "--script", f"{target}/model.yaml",
                         "--port", str(port), "--loop", "&"]
        assert (target / "model.yaml").read_text(encoding="utf-8") == MODEL
        # As printed, by the real command; then again (through the same entry, in-process) on
        # what the first run left behind.
        states = [state_of(heddle(*run[1:]))]
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # as tests/support/cli.py gives the command
        rc, out, err = heddle_inproc(capsys, *run[1:])
        assert rc == 0, err
        states.append(json.loads(out))
        assert len(model.requests()) == 4
    assert [state["result"] for state in states] == ["Your text has 4 words."] * 2


def test_init_without_a_port_picks_a_free_one_and_says_it(tmp_path: Path) -> None:
    lines = write_starter(tmp_path / "starter")
    serve = next(shlex.split(line) for line in lines if line.strip().startswith("heddle model serve"))
    port = int(serve[serve.index("--port") + 1])
    flow = (tmp_path / "starter" / "flow.yaml").read_text(encoding="utf-8")
    assert 0 < port <= 65535 and "--loop" in serve
    assert re.findall(r"url: (\S+)", flow) == [f"http://127.0.0.1:{port}/v1"]


def test_init_refuses_a_folder_with_files(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    proc = heddle("init", tmp_path)
    assert proc.returncode == 2 and "already exists and is not an empty folder" in proc.stderr
    assert (tmp_path / "x").read_text() == "keep me"
