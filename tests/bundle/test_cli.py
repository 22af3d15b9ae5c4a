"""The bundle commands through the real `heddle` entry point, in subprocesses."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from heddle.format.manifest import Requires
from heddle.format.pack import pack
from tests.support.cli import error_line, heddle

from .conftest import EXPECTED, VECTORS, agent_plan, write_agent


@pytest.fixture
def vector_pubs(sandbox: Path) -> dict[str, Path]:
    out = {}
    for name, record in EXPECTED["keys"].items():
        path = sandbox / f"{name}.pub"
        path.write_text(record["public_pem"])
        out[name] = path
    return out


def test_help_lists_the_bundle_commands() -> None:
    proc = heddle("--help")
    assert proc.returncode == 0
    for command in ("keygen", "sign", "verify", "inspect", "diff", "doctor", "trust"):
        assert f"  {command} " in proc.stdout


def test_keygen(sandbox: Path) -> None:
    proc = heddle("keygen", "--out", sandbox / "ci", "--no-passphrase")
    assert proc.returncode == 0, proc.stderr
    keyid = proc.stdout.strip()
    assert len(keyid) == 16
    assert stat.S_IMODE((sandbox / "ci.key").stat().st_mode) == 0o600
    assert (sandbox / "ci.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert os.listdir(sandbox / "trust") == []  # keygen never changes trust

    proc = heddle("keygen", "--out", sandbox / "me", env={"HEDDLE_KEY_PASSPHRASE": "pw"})
    assert proc.returncode == 0, proc.stderr
    assert (sandbox / "me.key").read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")

    proc = heddle("keygen", "--out", sandbox / "nopass")
    assert proc.returncode == 2
    assert "HEDDLE_KEY_PASSPHRASE" in error_line(proc)
    assert not (sandbox / "nopass.key").exists()

    proc = heddle("keygen", "--out", sandbox / "ci", "--no-passphrase")
    assert proc.returncode == 2 and "already exists" in error_line(proc)


@pytest.mark.parametrize("vector, flags, code", [
    ("valid-signed", ["--trust", "trusted"], 0),
    ("unsigned", ["--trust", "trusted"], 3),
    ("untrusted-signer", ["--trust", "trusted"], 4),
    ("flipped-manifest-byte", ["--trust", "trusted"], 5),
    ("flipped-payload-byte", ["--trust", "trusted"], 6),
    ("symlink-chain", ["--trust", "trusted"], 7),
    ("decompression-bomb", ["--trust", "trusted"], 7),
    ("newer-format-version", ["--trust", "trusted"], 8),
    ("legacy-gzip", ["--allow-unsigned"], 0),
])
def test_verify_exit_codes(sandbox: Path, vector_pubs: dict[str, Path], vector: str, flags: list[str], code: int) -> None:
    argv = [vector_pubs[f] if f in vector_pubs else f for f in flags]
    proc = heddle("verify", VECTORS / f"{vector}.heddle", *argv)
    assert proc.returncode == code, proc.stderr
    if code:
        line = error_line(proc)
        assert f"{vector}.heddle" in line
        assert proc.stderr.count("\n") == 1
    else:
        assert proc.stdout.startswith("verified ")


@pytest.mark.parametrize("vector, code", [("valid-signed", 0), ("flipped-payload-byte", 6)])
def test_verify_json(sandbox: Path, vector_pubs: dict[str, Path], vector: str, code: int) -> None:
    proc = heddle("verify", VECTORS / f"{vector}.heddle", "--trust", vector_pubs["trusted"], "--json")
    assert proc.returncode == code
    outcome = json.loads(proc.stdout)
    assert outcome["ok"] is (code == 0)
    if code:
        assert outcome["error"] == {"kind": "content_mismatch", "exit_code": 6, "message": outcome["error"]["message"]}
        assert "tools/echo.py" in outcome["error"]["message"]
    else:
        assert outcome["signers"] == [EXPECTED["keys"]["trusted"]["keyid"]]
        assert Path(outcome["root"]).is_dir()


def test_trust_store_commands_and_verify_without_flags(sandbox: Path, vector_pubs: dict[str, Path]) -> None:
    bundle = VECTORS / "valid-signed.heddle"
    assert heddle("verify", bundle).returncode == 4
    proc = heddle("trust", "add", vector_pubs["trusted"])
    keyid = EXPECTED["keys"]["trusted"]["keyid"]
    assert proc.returncode == 0 and keyid in proc.stdout
    assert keyid in heddle("trust", "list").stdout
    assert heddle("verify", bundle).returncode == 0
    # --trust pins: naming another key means the store's keys are not trusted for this command.
    assert heddle("verify", bundle, "--trust", vector_pubs["second"]).returncode == 4
    assert heddle("verify", bundle, "--trust", keyid).returncode == 0
    assert heddle("trust", "remove", keyid).returncode == 0
    assert heddle("trust", "list").stdout == ""
    proc = heddle("trust", "remove", keyid)
    assert proc.returncode == 2 and "no trusted key" in error_line(proc)
    proc = heddle("verify", bundle, "--trust", "nonexistent.pub")
    assert proc.returncode == 2 and "--trust nonexistent.pub" in error_line(proc)
    proc = heddle("verify", sandbox / "nowhere.heddle")
    assert proc.returncode == 2 and "nowhere.heddle: no such file" in error_line(proc)


def test_sign_inspect_and_verify(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "app.heddle"
    pack(agent_plan(paths), bundle)
    assert heddle("keygen", "--out", sandbox / "me", "--no-passphrase").returncode == 0
    proc = heddle("inspect", bundle)
    assert proc.returncode == 0
    assert "UNVERIFIED" in proc.stdout.splitlines()[0]
    digest_before = json.loads(heddle("inspect", bundle, "--json").stdout)["digest"]

    proc = heddle("sign", bundle, "--key", sandbox / "me.key")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(heddle("inspect", bundle, "--json", "--trust", sandbox / "me.pub").stdout)
    assert info["digest"] == digest_before
    assert info["status"] == "UNVERIFIED" and "not checked yet" in info["detail"]
    assert info["manifest"]["tools"]["echo"]["fingerprint"].startswith("sha256:")

    assert heddle("verify", bundle, "--trust", sandbox / "me.pub").returncode == 0
    proc = heddle("inspect", bundle, "--trust", sandbox / "me.pub")
    assert proc.stdout.splitlines()[0].endswith("payload verified in the cache)")
    assert "VERIFIED" in proc.stdout.splitlines()[0] and "UNVERIFIED" not in proc.stdout.splitlines()[0]
    assert "echo" in proc.stdout and "tools/echo.py" in proc.stdout


def test_diff(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    a, b = sandbox / "a.heddle", sandbox / "b.heddle"
    pack(agent_plan(paths), a)
    (paths["notes"] / "readme.md").write_text("# notes, edited\n")
    (paths["work"] / "new.txt").write_text("new\n")
    flow = json.loads(paths["flow"].read_text())
    tool = flow["$referenced_components"]["echo-node"]["tool"]
    tool["inputs"].append({"title": "loud", "type": "boolean", "default": False})
    paths["flow"].write_text(json.dumps(flow))
    pack(agent_plan(paths, input={"text": "x"}), b)
    proc = heddle("diff", a, b)
    assert proc.returncode == 0
    out = proc.stdout
    assert "+ file mounts/work/new.txt" in out
    assert "~ file mounts/notes/readme.md" in out
    assert "~ file flow.json" in out
    assert "~ tool echo input-schema fingerprint: sha256:" in out
    assert "~ input" in out
    assert heddle("diff", a, a).stdout.strip() == "no differences"
    changes = json.loads(heddle("diff", a, b, "--json").stdout)
    assert changes["files"]["added"] == ["mounts/work/new.txt"]


def test_doctor_checks_requirements_without_printing_values(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "needs.heddle"
    requires = Requires(bins=("sh", "surely-not-a-binary-xyz"), env=("HEDDLE_TEST_TOKEN",),
                        files=(str(paths["flow"]), "~/missing.txt"))
    pack(agent_plan(paths, requires=requires), bundle)
    proc = heddle("doctor", bundle, env={"HEDDLE_TEST_TOKEN": "top-secret-value"})
    assert proc.returncode == 9
    assert "top-secret-value" not in proc.stdout + proc.stderr
    assert "ok      env  HEDDLE_TEST_TOKEN: set" in proc.stdout
    assert "MISSING bin  surely-not-a-binary-xyz" in proc.stdout
    assert "MISSING file ~/missing.txt" in proc.stdout
    assert "2 of 5 requirements missing" in error_line(proc)
    (sandbox / "home" / "missing.txt").write_text("here now\n")
    met = Requires(bins=("sh",), env=("HEDDLE_TEST_TOKEN",), files=("~/missing.txt",))
    pack(agent_plan(paths, requires=met), bundle)
    assert heddle("doctor", bundle, env={"HEDDLE_TEST_TOKEN": "v"}).returncode == 0
