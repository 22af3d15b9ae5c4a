"""`heddle init DIR` writes a starter that runs exactly as printed."""

from __future__ import annotations

import shlex

from tests.support.cli import heddle, state_of
from tests.support.scripted_model import scripted_model


def test_init_writes_a_starter_that_runs_as_printed(tmp_path):
    target = tmp_path / "starter"
    proc = heddle("init", target)
    assert proc.returncode == 0, proc.stderr
    commands = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("heddle ")]
    serve, run = commands
    serve_args = shlex.split(serve.rstrip("&").strip())
    script = serve_args[serve_args.index("--script") + 1]
    port = serve_args[serve_args.index("--port") + 1]
    with scripted_model(__import__("pathlib").Path(script), tmp_path, ["--port", port]) as model:
        state = state_of(heddle(*shlex.split(run)[1:]))
        assert len(model.requests()) == 2
    assert state["result"] == "Your text has 4 words."
    assert heddle("validate", target / "flow.yaml", "--tools-dir", target / "tools").returncode == 0


def test_init_refuses_a_folder_with_files(tmp_path):
    (tmp_path / "x").write_text("keep me")
    proc = heddle("init", tmp_path)
    assert proc.returncode == 2 and "already exists and is not an empty folder" in proc.stderr
    assert (tmp_path / "x").read_text() == "keep me"
