"""A plugin's `command` starts only what its folder holds: a program in it, or an allowed
interpreter given a file in it, with no option that runs code from elsewhere. Checked when a
bundle is sealed and whenever a manifest is loaded to run (a `--plugin` or a bundle's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from heddle.format.keys import generate
from heddle.plugin_host.errors import PluginLoadError
from heddle.plugin_host.manifest import load_manifest
from tests.plugins.support import make_plugin, middleware, tool_chain_flow
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc_proc import heddle_here

EVIL = "import pathlib, os; pathlib.Path(os.environ['EVIL_MARK']).write_text('ran')\n"


def _refusal(manifest: Path) -> str:
    with pytest.raises(PluginLoadError) as caught:
        load_manifest(manifest)
    return caught.value.message


def _evil_plugin(tmp_path: Path, command: list[str]) -> Path:
    """A plugin whose own program is harmless, and an evil.py outside its folder."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evil.py").write_text(EVIL)
    manifest = make_plugin(tmp_path / "plug", name="plug", components=[middleware("Gate", "toolCall.before")])
    _set_command(manifest, command)
    return manifest


def _set_command(manifest: Path, command: list[str]) -> None:
    data = json.loads(manifest.read_text())
    data["command"] = command
    manifest.write_text(json.dumps(data))


@pytest.mark.parametrize("command, expected", [
    (["python3", "-cexec(open('/x/evil.py').read())", "plugin.py"], "command[1] \"-cexec(open('/x/evil.py').read())\" would run code given on the command line (-c)"),
    (["python3", "-c", "import os", "plugin.py"], "command[1] '-c' would run code given on the command line"),
    (["python3", "-Ic", "print(1)", "plugin.py"], "command[1] '-Ic' would run code given on the command line"),
    (["python3", "-ic", "print(1)", "plugin.py"], "command[1] '-ic' would run code read from stdin"),
    (["python3", "-m", "http.server"], "command[1] '-m' would run a module looked up outside the folder"),
    (["python3", "-W", "ignore", "plugin.py"], "command[1] '-W' holds -W, which is not an option"),
    (["python3.11", "-u", "-", "plugin.py"], "command[2] '-' would run code read from stdin"),
    (["node", "-e", "require('child_process')", "plugin.py"], "command[1] '-e' would run code given on the command line"),
    (["node", "--eval=1", "plugin.py"], "command[1] '--eval=1' would run code given on the command line"),
    (["node", "-p", "1", "plugin.py"], "command[1] '-p' would run code given on the command line"),
    (["node", "--print", "1", "plugin.py"], "command[1] '--print' would run code given on the command line"),
    (["node", "--require", "/x/evil.js", "plugin.py"], "command[1] '--require' would run a module loaded before"),
    (["sh", "-c", "id", "plugin.py"], "command[1] '-c' would run code given on the command line"),
    (["bash", "-ec", "id", "plugin.py"], "command[1] '-ec' would run code given on the command line"),
    (["bash", "--rcfile", "/x/rc", "plugin.py"], "command[1] '--rcfile' would run a start-up file"),
    (["perl", "plugin.py"], "command[0] 'perl' is neither a program in the plugin folder nor an interpreter"),
    (["env", "python3", "plugin.py"], "command[0] 'env' is neither a program in the plugin folder"),
    (["python3.11.4", "plugin.py"], "command[0] 'python3.11.4' is neither"),
    (["python3", "../elsewhere/evil.py"], "command[1] '../elsewhere/evil.py' leaves the plugin folder"),
])
def test_commands_that_run_code_the_folder_does_not_hold_are_refused(tmp_path, command, expected):
    manifest = _evil_plugin(tmp_path, command)
    message = _refusal(manifest)
    assert message.startswith(f"{manifest}: ") and expected in message, message
    # What is allowed is said in the same line.
    assert "plugin folder" in message and "\n" not in message


def test_allowed_commands_name_a_file_in_the_folder(tmp_path):
    for command in (["python3.12", "-u", "plugin.py"], ["python3", "-IB", "plugin.py", "--any", "-c", "args"],
                    ["node", "--no-warnings", "--max-old-space-size=64", "plugin.py"], ["bash", "-eu", "plugin.py"],
                    ["sh", "plugin.py"], ["./plugin.py"]):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        manifest = _evil_plugin(folder, command)
        loaded = load_manifest(manifest)
        assert loaded.program == loaded.root / "plugin.py", command


def test_a_program_linked_out_of_the_folder_is_refused(tmp_path):
    manifest = _evil_plugin(tmp_path, ["python3", "run.py"])
    os.symlink(tmp_path / "elsewhere" / "evil.py", manifest.parent / "run.py")
    assert "command[1] 'run.py' leads out of the plugin folder (through a link)" in _refusal(manifest)
    os.symlink("/usr/bin/python3", manifest.parent / "py")
    _set_command(manifest, ["./py", "plugin.py"])
    assert "command[0] './py' leads out of the plugin folder" in _refusal(manifest)


def test_inline_code_never_runs_from_a_plugin_flag_a_seal_or_a_bundle(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    mark = tmp_path / "ran.txt"
    evil = tmp_path / "elsewhere" / "evil.py"
    manifest = _evil_plugin(tmp_path, ["python3", f"-cexec(open('{evil}').read())", "plugin.py"])
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    env = {"EVIL_MARK": str(mark)}

    # heddle run --plugin: the manifest is loaded to run.
    proc = heddle("run", flow, "-t", tools, "--plugin", manifest, "--input", "{}", env=env)
    assert proc.returncode == 2, proc.stderr
    assert f"{manifest}: command[1]" in error_line(proc) and "-c" in error_line(proc)
    assert not mark.exists()

    # heddle bundle --plugin: refused at seal, nothing written. This and the bundle's refusal below
    # through the command's entry in this process (the plugins it would start inherit EVIL_MARK
    # from it as from a `heddle` process).
    monkeypatch.setenv("EVIL_MARK", str(mark))
    out = tmp_path / "app.heddle"
    generate(tmp_path / "me", None)
    proc = heddle_here(capsys, "bundle", flow, "-t", tools, "--plugin", manifest, "--sign-key", tmp_path / "me.key",
                       "-o", out)
    assert proc.returncode == 2 and f"{manifest}: command[1]" in error_line(proc)
    assert not out.exists() and not mark.exists()

    # A bundle sealed without that check (an older heddle, or by hand) is refused when opened.
    from heddle.bundle.fingerprints import flow_tool_fingerprints
    from heddle.format.keys import load_signing_key
    from heddle.bundle.plan import ToolSpec, make_plan
    from heddle.format.pack import pack

    fps = flow_tool_fingerprints(flow)
    plan = make_plan(flow, tools_dir=tools, tools={n: ToolSpec(tools / f"{n}.py", fp) for n, fp in fps.items()},
                     plugins=[manifest])
    pack(plan, out, signing_key=load_signing_key(tmp_path / "me.key"))
    proc = heddle_here(capsys, "run", out, "--trust", tmp_path / "me.pub", "--input", "{}")
    assert proc.returncode != 0
    assert "plugins/plug/plugin.json: command[1]" in error_line(proc) and "Traceback" not in proc.stderr
    assert not mark.exists()
