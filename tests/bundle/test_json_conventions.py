"""Conventions every command keeps under `--json` and for scripts: `heddle diff --exit-code` says
whether bundles differ by its status, a digest is spelled `sha256:<hex>` in every JSON output, and a
failure under `--json` is one JSON object on stdout, whatever the command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from heddle.format.pack import pack
from tests.support.cli import heddle
from tests.support.cli_inproc import heddle_inproc

from .conftest import agent_plan, make_keypair, write_agent

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _two_bundles(sandbox: Path) -> tuple[Path, Path]:
    paths = write_agent(sandbox / "agent")
    a, b = sandbox / "a.heddle", sandbox / "b.heddle"
    pack(agent_plan(paths), a)
    (paths["work"] / "new.txt").write_text("new\n")
    pack(agent_plan(paths), b)
    return a, b


def test_diff_exit_code_says_whether_the_bundles_differ(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _two_bundles(sandbox)
    differ = heddle("diff", a, b, "--exit-code")
    assert differ.returncode == 1 and "+ file mounts/work/new.txt" in differ.stdout and differ.stderr == ""
    assert heddle_inproc(capsys, "diff", a, a, "--exit-code")[:2] == (0, "no differences\n")
    rc, out, _ = heddle_inproc(capsys, "diff", a, b, "--exit-code", "--json")
    assert rc == 1 and json.loads(out)["files"]["added"] == ["mounts/work/new.txt"]
    assert heddle_inproc(capsys, "diff", a, b)[0] == 0  # without the flag, as before


def test_every_json_digest_is_spelled_with_its_algorithm(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _two_bundles(sandbox)
    make_keypair(sandbox, "me")
    outputs = {args[0]: json.loads(heddle_inproc(capsys, *args)[1]) for args in (
        ("sign", a, "--key", sandbox / "me.key", "--json"),
        ("inspect", a, "--json"),
        ("verify", a, "--trust", sandbox / "me.pub", "--json"),
    )}
    digests = {name: out["digest"] for name, out in outputs.items()}
    assert len(set(digests.values())) == 1 and DIGEST.fullmatch(digests["verify"]), digests
    (entry,) = json.loads(heddle_inproc(capsys, "cache", "ls", "--json")[1])
    assert entry["digest"] == digests["verify"]


def test_a_failure_under_json_is_one_json_object_on_stdout(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = _two_bundles(sandbox)
    missing = sandbox / "missing.heddle"
    proc = heddle("diff", a, missing, "--json")
    failed = json.loads(proc.stdout)
    assert proc.returncode == failed["error"]["exit_code"] == 2
    assert failed["ok"] is False and str(missing) in failed["error"]["message"]
    assert proc.stderr.startswith("error: ")  # the line for a person stays on stderr
    # A usage error the command line parser finds, on another command.
    rc, out, _ = heddle_inproc(capsys, "cache", "ls", "--json", "--no-such-flag")
    assert rc == 2 and json.loads(out)["error"]["kind"] == "usage_error"
    assert "--no-such-flag" in json.loads(out)["error"]["message"]
    # verify names the bundle beside the error, as it always has.
    rc, out, _ = heddle_inproc(capsys, "verify", a, "--json")
    assert rc == 3 and json.loads(out) == {"ok": False, "bundle": str(a), "oci_digest": None, "error": {
        "kind": "unsigned", "exit_code": 3, "message": json.loads(out)["error"]["message"]}}
    # Without --json, no JSON.
    rc, out, err = heddle_inproc(capsys, "diff", a, missing)
    assert rc == 2 and out == "" and err.startswith("error: ")
