"""`--safe` confines plugin processes like tools: the system and the plugin folder read-only,
the plugin's home (where its nodes' workspaces are) writable, nothing else. Real bubblewrap.

The run without --safe is a real `heddle` process; the runs under --safe go through the command's
entry in this process, which starts the same bubblewrap and plugin processes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.plugins.support import make_plugin, node_type
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc

PROBE = '''
import json, os

def attempt(fn):
    try:
        return fn()
    except OSError as exc:
        return type(exc).__name__

def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "wrote"

@plugin.node("Probe")
def probe(call):
    target = call.input["outside"]
    return {"report": json.dumps({
        "workspace": attempt(lambda: write(call.workspace / "made.txt")),
        "home": attempt(lambda: write(os.path.join(os.environ["HEDDLE_PLUGIN_HOME"], "scratch.txt"))),
        "outside_write": attempt(lambda: write(os.path.join(target, "escaped.txt"))),
        "outside_read": attempt(lambda: open(os.path.join(target, "secret.txt")).read()),
        "own_folder": attempt(lambda: write(os.path.join(os.environ["HEDDLE_PLUGIN_DIR"], "changed.txt"))),
        "secret_env": os.environ.get("PLUGIN_TEST_SECRET"),
    })}
'''


def probe_flow(tmp_path: Path) -> Path:
    f = FlowDoc("probe")
    s = f.start(["outside"])
    p = f._node("Probe", "probe", [], [])
    e = f.end(["report"])
    f.control(s, p)
    f.control(p, e)
    return f.write(tmp_path / "flow.json")


def run_probe(tmp_path: Path, *flags: str,
              inproc: tuple[pytest.CaptureFixture[str], pytest.MonkeyPatch] | None = None) -> dict:
    """The probe's report from `heddle run --plugin` with `flags`, PLUGIN_TEST_SECRET in its
    environment: a real process, or with `inproc` the command's entry in this process (the
    secret set for the call only; the plugin and bubblewrap still real processes)."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("the secret")
    plugin = make_plugin(tmp_path / "probe", components=[node_type("Probe", ["outside"], ["report"])], code=PROBE)
    args = ["run", probe_flow(tmp_path), "--plugin", plugin, "--input", json.dumps({"outside": str(outside)}), *flags]
    if inproc is None:
        proc = heddle(*args, env={"PLUGIN_TEST_SECRET": "hunter2"})
    else:
        capsys, monkeypatch = inproc
        with monkeypatch.context() as env:
            env.setenv("PLUGIN_TEST_SECRET", "hunter2")
            proc = heddle_here(capsys, *args)
    return json.loads(state_of(proc)["report"])


def test_without_safe_a_plugin_runs_as_the_user(tmp_path):
    report = run_probe(tmp_path)
    assert report == {"workspace": "wrote", "home": "wrote", "outside_write": "wrote", "outside_read": "the secret",
                      "own_folder": "wrote", "secret_env": "hunter2"}


def test_under_safe_only_the_plugin_home_is_writable_and_nothing_else_is_there(tmp_path, capsys, monkeypatch):
    report = run_probe(tmp_path, "--safe", inproc=(capsys, monkeypatch))
    assert report["workspace"] == "wrote" and report["home"] == "wrote"
    assert report["outside_write"] == "FileNotFoundError"  # the folder is not in the sandbox at all
    assert report["outside_read"] == "FileNotFoundError"
    assert report["own_folder"] in ("OSError", "PermissionError")  # read-only
    assert report["secret_env"] is None
    assert not (tmp_path / "outside" / "escaped.txt").exists()
    assert not (tmp_path / "probe" / "changed.txt").exists()


def test_under_safe_the_allow_flags_apply_to_plugins_too(tmp_path, capsys, monkeypatch):
    report = run_probe(tmp_path, "--safe", "--allow-write", str(tmp_path / "outside"),
                       "--allow-env", "PLUGIN_TEST_SECRET", inproc=(capsys, monkeypatch))
    assert report["outside_write"] == "wrote" and report["outside_read"] == "the secret"
    assert report["secret_env"] == "hunter2"
    assert (tmp_path / "outside" / "escaped.txt").read_text() == "x"
    assert os.environ.get("PLUGIN_TEST_SECRET") is None
