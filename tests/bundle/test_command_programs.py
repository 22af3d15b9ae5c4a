"""A sealed command's program is pinned by its sha256 in the manifest: another file at its path never
runs. `heddle doctor` checks what a bundle needs of this machine (each command's program and version,
each plugin's runtime, bubblewrap for a bundle that proposes --safe) and exits 9 when it would not run."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.plugins.support import make_plugin
from tests.server.support import run_server_to_exit
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.commands import DATE, day_flow, entry, version_of, write_commands


def own_date(sandbox: Path) -> Path:
    """A copy of the real `date` at a path of the test's own, to be replaced later."""
    program = sandbox / "bin" / "date"
    program.parent.mkdir(exist_ok=True)
    shutil.copy2(DATE, program)
    return program


def look_alike(program: Path, ran: Path) -> None:
    """Put a script at `program` that prints the real version (so a probe alone would pass it)."""
    version = version_of(DATE).replace("'", "'\\''")
    program.unlink()
    program.write_text(f"#!/bin/sh\ntouch '{ran}'\nprintf '%s\\n' '{version}'\n")
    program.chmod(0o755)


Capsys = pytest.CaptureFixture[str]


def doctor(*args: Any, env: dict[str, str] | None = None, capsys: Capsys | None = None
           ) -> tuple[int, dict[str, Any], str]:
    """`heddle doctor ARGS --json`: the real process, or in this one given `capsys`."""
    proc = heddle_here(capsys, "doctor", *args, "--json") if capsys is not None else \
        heddle("doctor", *args, "--json", env=env)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def checks_of(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["kind"] == kind]


def test_a_program_replaced_after_sealing_fails_closed_naming_both_digests(sandbox: Path, keypair: Any,
                                                                           capsys: Capsys) -> None:
    program = own_date(sandbox)
    sealed_digest = hashlib.sha256(program.read_bytes()).hexdigest()
    flow = day_flow(sandbox / "flow.json")
    commands = write_commands(sandbox / "commands.json", entry(executable=str(program)))
    out = sandbox / "day.heddle"
    assert heddle_here(capsys, "bundle", flow, "--commands", commands, "--sign-key", keypair.key_path, "-o",
                       out).returncode == 0
    manifest = json.loads(heddle_here(capsys, "inspect", out, "--json").stdout)["manifest"]
    assert manifest["commands"]["entries"]["day_of"]["executable_path"] == str(program)
    assert manifest["commands"]["entries"]["day_of"]["executable_sha256"] == sealed_digest
    shown = heddle_here(capsys, "inspect", out).stdout
    assert f"program {program} sha256 {sealed_digest}" in shown
    assert state_of(heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"seconds": 0}'))[
        "stdout"] == "1970-01-01\n"

    ran = sandbox / "replacement-ran"
    look_alike(program, ran)
    proc = heddle("run", out, "--trust", keypair.pub_path, "--input", '{"seconds": 0}')
    assert proc.returncode != 0
    line = error_line(proc)
    here = hashlib.sha256(program.read_bytes()).hexdigest()
    assert sealed_digest in line and here in line and "the call was not made" in line, line
    assert not ran.exists()  # neither the probe nor the call ran it

    code, report, _ = doctor(out, "--trust", keypair.pub_path)
    assert code == 9 and not report["ok"]
    [bad] = checks_of(report, "command")
    assert not bad["ok"] and sealed_digest in bad["detail"] and here in bad["detail"]
    assert not ran.exists()
    program.unlink()
    code, report, stderr = doctor(out, "--trust", keypair.pub_path, capsys=capsys)
    assert code == 9 and str(program) in checks_of(report, "command")[0]["detail"]
    assert "command day_of" in stderr


def test_doctor_checks_each_commands_program_and_version(sandbox: Path, keypair: Any, capsys: Capsys) -> None:
    flow = day_flow(sandbox / "flow.json")
    good = write_commands(sandbox / "good.json", entry())
    out = sandbox / "day.heddle"
    assert heddle_here(capsys, "bundle", flow, "--commands", good, "--sign-key", keypair.key_path, "-o",
                       out).returncode == 0
    code, report, stderr = doctor(out, "--trust", keypair.pub_path, capsys=capsys)
    assert code == 0, stderr
    assert [c["ok"] for c in checks_of(report, "command")] == [True]
    [version] = checks_of(report, "version")
    assert version["ok"] and version["required"]
    text = heddle_here(capsys, "doctor", out, "--trust", keypair.pub_path).stdout
    assert "requires nothing" not in text and "ok      command day_of" in text

    # Sealed with a version this machine's program does not print: it would not run here.
    real = version_of(DATE)
    drifted = write_commands(sandbox / "drifted.json",
                             entry(expected_version=real.replace(real.splitlines()[0], "date (GNU coreutils) 0.1")))
    old = sandbox / "old.heddle"
    assert heddle_here(capsys, "bundle", flow, "--commands", drifted, "--sign-key", keypair.key_path, "-o",
                       old).returncode == 0
    code, report, stderr = doctor(old, "--trust", keypair.pub_path)
    assert code == 9, stderr
    [version] = checks_of(report, "version")
    assert not version["ok"] and "date (GNU coreutils) 0.1" in version["detail"]
    assert "version day_of" in stderr

    # Whose signers are not trusted here: the probe (a program run with the bundle's arguments) is not run.
    unsigned = sandbox / "unsigned.heddle"
    assert heddle_here(capsys, "bundle", flow, "--commands", drifted, "-o", unsigned).returncode == 0
    code, report, _ = doctor(unsigned, capsys=capsys)
    [version] = checks_of(report, "version")
    assert code == 0 and not version["ok"] and not version["required"] and "not run" in version["detail"]
    code, report, _ = doctor(unsigned, "--allow-unsigned", capsys=capsys)
    assert code == 9 and not checks_of(report, "version")[0]["ok"]


def test_doctor_checks_each_plugins_runtime_and_bubblewrap_for_a_safe_bundle(sandbox: Path, capsys: Capsys,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.flows import FlowDoc

    f = FlowDoc("plain")
    start = f.start(["x"])
    end = f.end(["x"])
    f.control(start, end)
    f.data(start, "x", end, "x")
    flow = f.write(sandbox / "flow.json")
    on_node = make_plugin(sandbox / "noder", command=["node", "plugin.js"], program="// a node plugin\n")
    on_python = make_plugin(sandbox / "pyer")
    out = sandbox / "plugins.heddle"
    proc = heddle_here(capsys, "bundle", flow, "--plugin", on_node, "--plugin", on_python, "-o", out)
    assert proc.returncode == 0, proc.stderr
    empty = sandbox / "empty-path"
    empty.mkdir()
    # doctor's reports in this process, with the PATH it looks runtimes up in emptied; the run and
    # the server below are the real processes a user starts.
    with monkeypatch.context() as m:
        m.setenv("PATH", str(empty))
        code, report, stderr = doctor(out, capsys=capsys)
    assert code == 9, stderr
    plugins = {c["name"]: c for c in checks_of(report, "plugin")}
    assert not plugins["noder"]["ok"] and "'node' is not on PATH" in plugins["noder"]["detail"]
    assert plugins["pyer"]["ok"]
    assert "plugin noder" in stderr

    # A bundle that proposes --safe needs a working bubblewrap; without one it would not run here.
    safe = sandbox / "safe.heddle"
    assert heddle_here(capsys, "bundle", flow, "--safe", "-o", safe).returncode == 0
    assert json.loads(heddle_here(capsys, "inspect", safe, "--json").stdout)["manifest"]["proposals"]["safe"] is True
    with monkeypatch.context() as m:
        m.setenv("PATH", str(empty))
        code, report, stderr = doctor(safe, capsys=capsys)
    assert code == 9, stderr
    [sandboxed] = checks_of(report, "sandbox")
    assert sandboxed["name"] == "bubblewrap" and "bwrap" in sandboxed["detail"]
    proc = heddle("run", safe, "--allow-unsigned", "--input", '{"x": "1"}', env={"PATH": str(empty)})
    assert proc.returncode != 0 and "bubblewrap" in error_line(proc)
    served = run_server_to_exit(sandbox, "--bundle", safe, "--allow-unsigned", env={"PATH": str(empty)})
    assert served.returncode != 0 and "--safe needs bubblewrap" in served.stderr


def test_a_manifest_pins_a_program_whole_or_not_at_all() -> None:
    from heddle.format.errors import MalformedBundleError
    from heddle.format.manifest import CommandEntry, CommandsEntry, FileEntry, Manifest, Proposals

    entry_ = CommandEntry("sha256:" + "a" * 64, "sha256:" + "b" * 64, "v1", "1", "/usr/bin/date", "c" * 64)
    good = Manifest(name="x", flow="flow.json", files=(FileEntry("commands/c.json", 0, "0" * 64, 420),
                                                       FileEntry("flow.json", 0, "0" * 64, 420)),
                    commands=CommandsEntry("commands/c.json", {"day_of": entry_}), proposals=Proposals(safe=True),
                    heddle_version="1")
    data = good.to_bytes()
    assert Manifest.from_bytes(data) == good
    for before, after, named in (
            (b',"executable_sha256":"' + b"c" * 64 + b'"', b"", "missing field 'executable_sha256'"),
            (b'"/usr/bin/date"', b'"usr/bin/date"', "executable_path"),  # not absolute
            (b'"safe":true', b'"safe":false', "proposals.safe")):  # no proposal is no field
        with pytest.raises(MalformedBundleError, match=named):
            Manifest.from_bytes(data.replace(before, after))
