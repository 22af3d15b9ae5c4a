"""A commands file sealed into a bundle: recorded in the manifest, re-read and re-checked wherever the
bundle opens, shown by `inspect`, compared by `diff`, and run from the verified cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.commands import day_flow, entry, write_commands


def test_a_sealed_command_runs_from_the_bundle_and_inspect_and_diff_show_it(
        sandbox: Path, keypair: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.tools.commands import load_commands

    flow = day_flow(sandbox / "flow.json")
    commands = write_commands(sandbox / "commands.json", entry())
    [command] = load_commands(commands)
    out = sandbox / "day.heddle"
    proc = heddle("bundle", flow, "--commands", commands, "--sign-key", keypair.key_path, "-o", out)
    assert proc.returncode == 0, proc.stderr
    # The sealed copy is what runs: the file it was sealed from may change or go (the run through
    # the command's entry in this process: `heddle run` of a bundle from a process is
    # tests/bundle/test_run_bundle.py's).
    commands.unlink()
    ran = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"seconds": 0}')
    assert state_of(ran)["stdout"] == "1970-01-01\n"

    shown = heddle_here(capsys, "inspect", out, "--trust", keypair.pub_path).stdout
    assert "commands   1 (commands/commands.json)" in shown
    assert f"revision {command.revision}" in shown
    assert f"input-schema fingerprint {command.input_schema_fingerprint}" in shown
    assert json.dumps(command.expected_version.splitlines()[0]) in shown
    manifest = json.loads(heddle_here(capsys, "inspect", out, "--json").stdout)["manifest"]
    assert manifest["commands"] == {"file": "commands/commands.json", "entries": {"day_of": {
        "revision": command.revision, "fingerprint": command.input_schema_fingerprint,
        "expected_version": command.expected_version, "adapter_version": "1",
        "executable_path": command.program.path, "executable_sha256": command.program.sha256}}}
    assert command.program.path == "/usr/bin/date" or command.program.path.endswith("/date")
    assert manifest["tools"] == {}
    verified = json.loads(heddle_here(capsys, "verify", out, "--trust", keypair.pub_path, "--json").stdout)
    assert verified["ok"] and verified["commands"] == ["day_of"]

    proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--commands", sandbox / "other.json")
    assert proc.returncode == 2 and "--commands cannot be used with the bundle" in error_line(proc)

    # A changed command keeping its adapter_version is flagged; one that raises it is not.
    for adapter, flagged in (("1", True), ("2", False)):
        write_commands(commands, entry(argv=["-u", "-d", "@{seconds}", "+%F"], adapter_version=adapter))
        newer = sandbox / f"day-{adapter}.heddle"
        assert heddle_here(capsys, "bundle", flow, "--commands", commands, "-o", newer).returncode == 0
        changes = json.loads(heddle_here(capsys, "diff", out, newer, "--json").stdout)["commands"]
        assert changes["changed_without_adapter_version"] == (["day_of"] if flagged else [])
        assert any(c["what"] == "day_of revision" for c in changes["changed"])
        lines = heddle_here(capsys, "diff", out, newer).stdout
        assert ("! command day_of: its configuration changed but its adapter_version did not" in lines) is flagged


def test_a_manifest_that_does_not_describe_its_commands_file_is_refused(
        sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from heddle.bundle.plan import make_plan
    from heddle.format.manifest import CommandEntry
    from heddle.format.pack import pack
    from heddle.tools.commands import read_commands

    flow = day_flow(sandbox / "flow.json")
    commands = read_commands(write_commands(sandbox / "commands.json", entry()))
    plan = make_plan(flow, commands=commands)
    assert plan.commands is not None
    sealed = plan.commands.entries["day_of"]
    for name, changed in (("revision", dataclasses.replace(sealed, revision="sha256:" + "0" * 64)),
                          ("adapter", dataclasses.replace(sealed, adapter_version="2"))):
        plan.commands = dataclasses.replace(plan.commands, entries={"day_of": changed})
        out = pack(plan, sandbox / f"{name}.heddle").path
        proc = heddle_here(capsys, "verify", out, "--allow-unsigned")
        assert proc.returncode == 6, proc.stderr
        assert "command 'day_of' has revision" in error_line(proc)
    plan.commands = dataclasses.replace(plan.commands, entries={
        "day_of": sealed, "extra": CommandEntry(sealed.revision, sealed.fingerprint, "1", "1")})
    proc = heddle_here(capsys, "verify", pack(plan, sandbox / "extra.heddle").path, "--allow-unsigned")
    assert proc.returncode == 6 and "command 'extra' is in the manifest but not in the sealed commands file" in \
        error_line(proc)


def test_the_manifest_reads_its_commands_exactly() -> None:
    from heddle.format.errors import MalformedBundleError
    from heddle.format.manifest import CommandEntry, CommandsEntry, FileEntry, Manifest, ToolEntry

    files = tuple(FileEntry(path, 2, "0" * 64, 420) for path in ("commands/c.yaml", "flow.json", "tools/t"))
    fp = "sha256:" + "1" * 64
    good = Manifest(name="n", flow="flow.json", files=files, heddle_version="0", commands=CommandsEntry(
        "commands/c.yaml", {"c": CommandEntry(fp, fp, "v 1\nmore", "1")}))
    assert Manifest.from_json(good.to_json()) == good
    assert "commands" not in Manifest(name="n", flow="flow.json", files=files, heddle_version="0").to_json()
    base = good.to_json()
    cases = [
        ({**base, "commands": {**base["commands"], "file": "commands/other.yaml"}}, "is not one of the files"),
        ({**base, "commands": {**base["commands"], "file": "flow.json"}}, "is the flow or its components file"),
        ({**base, "commands": {**base["commands"], "extra": 1}}, "unknown field 'extra'"),
        ({**base, "tools": {"c": ToolEntry("tools/t", fp).to_json()}}, "is also one of the tools"),
        ({**base, "commands": {"file": "commands/c.yaml", "entries": {"c": {
            **base["commands"]["entries"]["c"], "revision": "abc"}}}}, "revision: must be 'sha256:'"),
    ]
    for obj, problem in cases:
        with pytest.raises(MalformedBundleError, match=problem):
            Manifest.from_json(obj)
