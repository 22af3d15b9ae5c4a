"""`heddle init DIR` writes a starter that runs exactly as printed, again and again."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from heddle.starter import MODEL, write_starter
from tests.support.cli import heddle, state_of
from tests.support.scripted_model import scripted_model


def _commands(printed: str) -> list[list[str]]:
    return [shlex.split(line) for line in printed.splitlines() if line.strip().startswith("heddle ")]


def test_init_writes_a_starter_that_runs_twice_as_printed(tmp_path: Path) -> None:
    # The model starts first on a port the OS picks (it prints its URL), and `init --port` takes
    # that port: no fixed number, and no window in which another process could take it.
    script = tmp_path / "model.yaml"
    script.write_text(MODEL, encoding="utf-8")
    with scripted_model(script, tmp_path, ["--port", "0", "--loop"]) as model:
        target = tmp_path / "starter"
        proc = heddle("init", target, "--port", model.port)
        assert proc.returncode == 0, proc.stderr
        serve, run = _commands(proc.stdout)
        # The printed server command is what this test started, on the starter's own script.
        assert serve == ["heddle", "model", "serve", "--script", f"{target}/model.yaml",
                         "--port", str(model.port), "--loop", "&"]
        assert (target / "model.yaml").read_text(encoding="utf-8") == MODEL
        states = [state_of(heddle(*run[1:])) for _ in range(2)]
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
