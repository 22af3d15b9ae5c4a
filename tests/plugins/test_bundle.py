"""A bundle carries its plugins' folders: sealed on one machine, run on another from the
`.heddle` file alone (and the signer's public key), the plugin started from the verified cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from heddle.format.keys import generate
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def seal(tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str, *extra: str) -> tuple[Path, Path]:
    """Seal the example in a checkout of its own; return (bundle, public key) copied to a clean
    place, with the checkout removed."""
    src = tmp_path / "checkout"
    shutil.copytree(EXAMPLES / example, src)
    generate(src / "me", None)  # `heddle keygen` itself is tests/bundle/test_cli.py's
    # Setup: the command in this process (the last test seals through the real process).
    rc, _, err = heddle_inproc(capsys, "bundle", src / "flow.yaml", "-t", src / "tools", "--plugin",
                               src / "plugin" / "plugin.json", "--sign-key", src / "me.key", "-o", src / "app.heddle",
                               *extra)
    assert rc == 0, err
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(src / "app.heddle", other / "app.heddle")
    shutil.copy(src / "me.pub", other / "me.pub")
    shutil.rmtree(src)
    return other / "app.heddle", other / "me.pub"


def elsewhere(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "HEDDLE_CACHE_DIR": str(tmp_path / "cache")}


def test_a_bundle_with_a_plugin_node_type_runs_from_the_file_alone(tmp_path, capsys, monkeypatch):
    bundle, key = seal(tmp_path, capsys, "custom-node")
    env = elsewhere(tmp_path)
    proc = heddle("run", bundle, "--trust", key, "--input", '{"text": "Short. Sweet."}', env=env, cwd=bundle.parent)
    assert state_of(proc) == {"text": "Short. Sweet.", "words": 2, "sentences": 2, "reading_seconds": 1}
    # What the bundle reports, read by the same commands in this process, in the same elsewhere.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(bundle.parent)
    rc, out, err = heddle_inproc(capsys, "validate", bundle, "--trust", key, "--json")
    assert rc == 0, err
    [row] = json.loads(out)["plugins"]
    assert row["name"] == "text-stats" and str(tmp_path / "cache") in row["manifest"]
    rc, out, err = heddle_inproc(capsys, "inspect", bundle)
    assert rc == 0 and "text-stats" in out, err


def test_a_bundle_installs_its_middleware_and_takes_settings_where_it_runs(tmp_path, capsys, monkeypatch):
    bundle, key = seal(tmp_path, capsys, "audit-log", "--requires", '{"bins": ["node"]}')
    env = elsewhere(tmp_path)
    log = tmp_path / "audit.jsonl"
    # The refusal and the run through the command's entry in this process, in the same elsewhere
    # (a bundle's plugin started from a process: the test above).
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rc, _, err = heddle_inproc(capsys, "run", bundle, "--trust", key, "--input", '{"title": "a b c"}')
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors and "--plugin-config AuditLog: the settings do not match the schema of plugin 'audit' " \
                      "(AuditLog): 'path' is a required property" in errors[-1], err
    proc = heddle_here(capsys, "run", bundle, "--trust", key, "--input", '{"title": "a b c"}',
                       "--plugin-config", f'AuditLog={{"path": "{log}"}}')
    assert state_of(proc)["words"] == 3
    assert [json.loads(line)["node"] for line in log.read_text().splitlines()] == [
        "start", "start", "slug", "slug", "count", "count"]


def test_a_flow_naming_a_plugin_tool_is_sealed_with_the_plugin_not_the_tools_folder(tmp_path, capsys, monkeypatch):
    from tests.plugins.support import make_plugin
    from tests.support.flows import FlowDoc, server_tool

    src = tmp_path / "checkout"
    make_plugin(src / "plugin", name="reverser", code='''
@plugin.tool("reverse")
def reverse(call):
    return {"reversed": call.arguments["text"][::-1]}
''', tools=[{"name": "reverse", "description": "Reverses a text.", "componentType": "Reverser",
             "inputSchema": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}}])
    f = FlowDoc("reverse")
    s = f.start(["text"])
    t = f.tool_node("reverse", server_tool("reverse", ["text"]))
    e = f.end(["reversed"])
    f.control(s, t)
    f.control(t, e)
    f.write(src / "flow.json")
    proc = heddle("bundle", src / "flow.json", "--plugin", src / "plugin" / "plugin.json", "-o",
                  tmp_path / "app.heddle")
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(src)
    # The run through the command's entry in this process, elsewhere (the seal is the process here).
    for name, value in elsewhere(tmp_path).items():
        monkeypatch.setenv(name, value)
    proc = heddle_here(capsys, "run", tmp_path / "app.heddle", "--allow-unsigned", "--input", '{"text": "abc"}')
    assert state_of(proc) == {"text": "abc", "reversed": "cba"}
