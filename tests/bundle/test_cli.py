"""The bundle commands through the real `heddle` entry point, in subprocesses.

Each command, exit status and error line is checked in a real process at least once; further
facts about the same commands (another vector, a second report of the same state) run them
through the entry function in this process (`_cli`), which prints the same lines without a
process start each.
"""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from heddle.format.manifest import Requires
from heddle.format.pack import pack
from tests.support.cli import error_line, heddle

from .conftest import EXPECTED, VECTORS, agent_plan, make_keypair, write_agent


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


def test_keygen(sandbox: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # keygen's success as a process is test_quiet_and_verbose_mean_the_same_on_every_command's;
    # its refusal's is below.
    rc, out, err = _cli(capsys, "keygen", "--out", sandbox / "ci", "--no-passphrase")
    assert rc == 0, err
    keyid = out.strip()
    assert len(keyid) == 16
    assert stat.S_IMODE((sandbox / "ci.key").stat().st_mode) == 0o600
    assert (sandbox / "ci.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert os.listdir(sandbox / "trust") == []  # keygen never changes trust

    proc = heddle("keygen", "--out", sandbox / "nopass")
    assert proc.returncode == 2
    assert "HEDDLE_KEY_PASSPHRASE" in error_line(proc)
    assert not (sandbox / "nopass.key").exists()

    monkeypatch.setenv("HEDDLE_KEY_PASSPHRASE", "pw")
    rc, _, err = _cli(capsys, "keygen", "--out", sandbox / "me")
    assert rc == 0, err
    assert (sandbox / "me.key").read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    monkeypatch.delenv("HEDDLE_KEY_PASSPHRASE")

    rc, _, err = _cli(capsys, "keygen", "--out", sandbox / "ci", "--no-passphrase")
    assert rc == 2 and "already exists" in _error_line(err)


# A real process for a refusal (the status and the one stderr line as a user sees them); the other
# vectors through the same entry function in this process. A success is seen from a process in
# test_trust_store_commands_and_verify_without_flags.
@pytest.mark.parametrize("vector, flags, code, real", [
    ("valid-signed", ["--trust", "trusted"], 0, False),
    ("unsigned", ["--trust", "trusted"], 3, False),
    ("untrusted-signer", ["--trust", "trusted"], 4, False),
    ("flipped-manifest-byte", ["--trust", "trusted"], 5, False),
    ("flipped-payload-byte", ["--trust", "trusted"], 6, True),
    ("symlink-chain", ["--trust", "trusted"], 7, False),
    ("decompression-bomb", ["--trust", "trusted"], 7, False),
    ("newer-format-version", ["--trust", "trusted"], 8, False),
    ("legacy-gzip", ["--allow-unsigned"], 0, False),
])
def test_verify_exit_codes(sandbox: Path, vector_pubs: dict[str, Path], capsys: pytest.CaptureFixture[str],
                           vector: str, flags: list[str], code: int, real: bool) -> None:
    argv = [vector_pubs.get(f, f) for f in flags]
    if real:
        proc = heddle("verify", VECTORS / f"{vector}.heddle", *argv)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        rc, out, err = _cli(capsys, "verify", VECTORS / f"{vector}.heddle", *argv)
    assert rc == code, err
    if code:
        assert f"{vector}.heddle" in _error_line(err)
        assert err.count("\n") == 1
    else:
        assert out.startswith("verified ")


# In-process: the status and stderr of this refusal from a process are test_verify_exit_codes's.
@pytest.mark.parametrize("vector, code", [("valid-signed", 0), ("flipped-payload-byte", 6)])
def test_verify_json(sandbox: Path, vector_pubs: dict[str, Path], capsys: pytest.CaptureFixture[str], vector: str,
                     code: int) -> None:
    args = ("verify", VECTORS / f"{vector}.heddle", "--trust", vector_pubs["trusted"], "--json")
    rc, out, _ = _cli(capsys, *args)
    assert rc == code
    outcome = json.loads(out)
    assert outcome["ok"] is (code == 0)
    if code:
        assert outcome["error"] == {"kind": "content_mismatch", "exit_code": 6, "message": outcome["error"]["message"]}
        assert "tools/echo.py" in outcome["error"]["message"]
    else:
        assert outcome["signers"] == [EXPECTED["keys"]["trusted"]["keyid"]]
        assert Path(outcome["root"]).is_dir()


def test_trust_store_commands_and_verify_without_flags(sandbox: Path, vector_pubs: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bundle = VECTORS / "valid-signed.heddle"
    # Processes for what a user sees of the store (add, a verify that reads it, a refusal); the
    # other steps through the entry function, which reads the same store.
    rc, _, err = _cli(capsys, "verify", bundle)
    assert rc == 4 and "valid-signed.heddle" in _error_line(err)
    proc = heddle("trust", "add", vector_pubs["trusted"])
    keyid = EXPECTED["keys"]["trusted"]["keyid"]
    assert proc.returncode == 0 and keyid in proc.stdout
    assert keyid in _cli(capsys, "trust", "list")[1]
    proc = heddle("verify", bundle)
    assert proc.returncode == 0 and proc.stdout.startswith("verified "), proc.stderr
    # --trust pins: naming another key means the store's keys are not trusted for this command.
    assert _cli(capsys, "verify", bundle, "--trust", vector_pubs["second"])[0] == 4
    assert _cli(capsys, "verify", bundle, "--trust", keyid)[0] == 0
    assert _cli(capsys, "trust", "remove", keyid)[0] == 0
    assert _cli(capsys, "trust", "list")[1] == ""
    proc = heddle("trust", "remove", keyid)
    assert proc.returncode == 2 and "no trusted key" in error_line(proc)
    rc, _, err = _cli(capsys, "verify", bundle, "--trust", "nonexistent.pub")
    assert rc == 2 and "--trust nonexistent.pub" in _error_line(err)
    rc, _, err = _cli(capsys, "verify", sandbox / "nowhere.heddle")
    assert rc == 2 and "nowhere.heddle: no such file" in _error_line(err)


def test_sign_inspect_and_verify(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "app.heddle"
    pack(agent_plan(paths), bundle)
    make_keypair(sandbox, "me")  # what `heddle keygen --no-passphrase` writes (test_keygen runs the command)
    # inspect as a process is the last step's, once the bundle is signed and verified.
    rc, out, _ = _cli(capsys, "inspect", bundle)
    assert rc == 0
    assert "UNVERIFIED" in out.splitlines()[0]
    digest_before = json.loads(_cli(capsys, "inspect", bundle, "--json")[1])["digest"]

    proc = heddle("sign", bundle, "--key", sandbox / "me.key")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(_cli(capsys, "inspect", bundle, "--json", "--trust", sandbox / "me.pub")[1])
    assert info["digest"] == digest_before
    assert info["status"] == "UNVERIFIED" and "not checked yet" in info["detail"]
    assert info["manifest"]["tools"]["echo"]["fingerprint"].startswith("sha256:")

    assert _cli(capsys, "verify", bundle, "--trust", sandbox / "me.pub")[0] == 0
    proc = heddle("inspect", bundle, "--trust", sandbox / "me.pub")
    assert proc.stdout.splitlines()[0].endswith("payload verified in the cache)")
    assert "VERIFIED" in proc.stdout.splitlines()[0] and "UNVERIFIED" not in proc.stdout.splitlines()[0]
    assert "echo" in proc.stdout and "tools/echo.py" in proc.stdout


def test_verify_imports_the_document_models_while_the_payload_is_checked(
    sandbox: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools' fingerprint check needs the document models (half of the command's fixed cost):
    their import starts on a thread before the bundle is read, and the check waits for it."""
    import threading

    from heddle.format import verify

    bundle = sandbox / "app.heddle"
    pack(agent_plan(write_agent(sandbox / "agent")), bundle)
    events: list[str] = []
    real_start, real_walk = threading.Thread.start, verify.walk_payload

    def start(thread: threading.Thread) -> None:
        events.append(thread.name)
        real_start(thread)

    def walk(*args: object, **kwargs: object) -> None:
        events.append("payload")
        real_walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(verify, "walk_payload", walk)
    assert _cli(capsys, "verify", bundle, "--allow-unsigned")[0] == 0
    assert [e for e in events if e in ("heddle-import", "payload")] == ["heddle-import", "payload"]


def test_diff(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    assert _cli(capsys, "diff", a, a)[1].strip() == "no differences"
    changes = json.loads(_cli(capsys, "diff", a, b, "--json")[1])
    assert changes["files"]["added"] == ["mounts/work/new.txt"]


def test_doctor_checks_requirements_without_printing_values(sandbox: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "needs.heddle"
    requires = Requires(bins=("sh", "surely-not-a-binary-xyz"), env=("HEDDLE_TEST_TOKEN",),
                        files=(str(paths["flow"]), "~/missing.txt"))
    pack(agent_plan(paths, requires=requires), bundle)
    # doctor's exit 9 and error line from a process are test_doctor_json_keeps_the_exit_status's.
    monkeypatch.setenv("HEDDLE_TEST_TOKEN", "top-secret-value")
    rc, out, err = _cli(capsys, "doctor", bundle)
    assert rc == 9
    assert "top-secret-value" not in out + err
    assert "ok      env  HEDDLE_TEST_TOKEN: set" in out
    assert "MISSING bin  surely-not-a-binary-xyz" in out
    assert "MISSING file ~/missing.txt" in out
    assert "2 of 5 requirements missing" in _error_line(err)
    (sandbox / "home" / "missing.txt").write_text("here now\n")
    met = Requires(bins=("sh",), env=("HEDDLE_TEST_TOKEN",), files=("~/missing.txt",))
    pack(agent_plan(paths, requires=met), bundle)
    monkeypatch.setenv("HEDDLE_TEST_TOKEN", "v")
    assert _cli(capsys, "doctor", bundle)[0] == 0


def test_quiet_and_verbose_mean_the_same_on_every_command(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # stdout is the result and never changes with -q or -v; -q silences notes, -v adds details.
    proc = heddle("keygen", "--out", sandbox / "me", "--no-passphrase", "-q")
    assert proc.returncode == 0 and len(proc.stdout.strip()) == 16 and proc.stderr == ""
    rc, _, err = _cli(capsys, "keygen", "--out", sandbox / "v", "--no-passphrase", "--verbose")
    assert rc == 0 and "not encrypted (--no-passphrase)" in err and "wrote " in err
    rc, _, err = _cli(capsys, "trust", "ls", "-q", "-v")
    assert rc == 2 and "--quiet or --verbose, not both" in _error_line(err)


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """`heddle ARGS` in this process (for what it prints; the entry point itself is tested in a process)."""
    from heddle.cli import app
    from heddle.cli.errors import run_app

    capsys.readouterr()  # earlier prints are not this command's output
    rc = run_app(app, [str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _error_line(stderr: str) -> str:
    """The last `error: ` line, as tests/support/cli.py's `error_line` finds it in a process's stderr."""
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert lines, f"no error line on stderr: {stderr!r}"
    return lines[-1]


def test_every_report_has_json(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _cli(capsys, "keygen", "--out", sandbox / "me", "--no-passphrase", "--json")
    made = json.loads(out)
    assert rc == 0 and made["public_key"] == str(sandbox / "me.pub") and made["encrypted"] is False
    assert _cli(capsys, "trust", "ls", "--json")[1].strip() == "[]"
    assert _cli(capsys, "trust", "ls", "-q")[2] == ""
    added = json.loads(_cli(capsys, "trust", "add", sandbox / "me.pub", "--json")[1])
    assert added["added"] is True and added["keyid"] == made["keyid"] and Path(added["path"]).is_file()
    assert [k["keyid"] for k in json.loads(_cli(capsys, "trust", "ls", "--json")[1])] == [made["keyid"]]
    assert _cli(capsys, "trust", "list")[1].split()[0] == made["keyid"]  # the first name still works

    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "app.heddle"
    pack(agent_plan(paths), bundle)
    signed = json.loads(_cli(capsys, "sign", bundle, "--key", sandbox / "me.key", "--json")[1])
    assert signed["signatures"] == [made["keyid"]] and signed["digest"].startswith("sha256:")
    rc, _, err = _cli(capsys, "verify", bundle, "-v")
    assert rc == 0 and f"trusting 1 key(s) in the trust store {sandbox / 'trust'}" in err
    assert "checked and unpacked" in err
    doctor = json.loads(_cli(capsys, "doctor", bundle, "--json")[1])
    # Which isolation layers the machine enforces: reported, never a requirement.
    assert [layer["layer"] for layer in doctor.pop("isolation")] == ["sandbox", "netns", "proxy", "seccomp", "rlimits"]
    assert doctor == {
        "bundle": str(bundle), "ok": True, "checks": [],
        "tracing": {"ok": True, "detail": "off (OTEL_EXPORTER_OTLP_ENDPOINT is not set)"}}
    rc, out, err = _cli(capsys, "cache", "prune", "--all", "--json", "-q")
    pruned = json.loads(out)
    assert rc == 0 and err == "" and len(pruned["removed"]) == 1 and pruned["kept"] == 0
    removed = json.loads(_cli(capsys, "trust", "remove", made["keyid"], "--json")[1])
    assert removed["removed"] == made["keyid"]


def test_bundle_and_validate_take_json_quiet_and_verbose(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "app.heddle"
    rc, out, err = _cli(capsys, "bundle", paths["flow"], "-t", paths["tools"], "-m", paths["notes"], "-o", bundle,
                        "--json", "-q")
    sealed = json.loads(out)
    assert rc == 0 and err == "" and sealed["bundle"] == str(bundle) and sealed["skipped"]
    rc, _, err = _cli(capsys, "validate", bundle, "--allow-unsigned", "-v")
    assert rc == 0 and f"verified {bundle}: {sealed['digest']}, signed by nobody" in err
    rc, _, err = _cli(capsys, "validate", bundle, "--allow-unsigned")
    assert rc == 0 and "verified" not in err
    assert _cli(capsys, "init", sandbox / "starter", "-q", "-v")[0] == 2


def test_help_lists_every_command_without_importing_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    from heddle.cli.root import COMMANDS, load_command

    code = ("import sys\nfrom heddle.cli import main\nsys.argv = ['heddle', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m in ('typer', 'heddle.cli.run', 'heddle.cli.bundle',"
            " 'heddle.cli.model', 'pydantic')), file=sys.stderr)")
    def main(arg: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, arg], check=False, capture_output=True, text=True,
                              timeout=60, cwd=tmp_path)

    version = main("--version")
    assert version.stdout == heddle("--version").stdout and version.stderr.strip() == "[]"
    listed = main("--help")
    assert listed.stderr.strip() == "['typer']"
    for name, entry in COMMANDS.items():
        assert f"  {name:<8}  {entry.summary}" in listed.stdout
        assert load_command(name).name == name  # every row of the table names a real command
    rc, _, err = _cli(capsys, "rnu")
    assert rc == 2 and "Did you mean 'run'?" in err


def test_doctor_json_keeps_the_exit_status(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "needs.heddle"
    pack(agent_plan(paths, requires=Requires(bins=("sh", "surely-not-a-binary-xyz"))), bundle)
    proc = heddle("doctor", bundle, "--json")
    assert proc.returncode == 9 and "1 of 2 requirements missing" in error_line(proc)
    report = json.loads(proc.stdout)  # the report on stdout, the verdict on stderr and in the status
    assert report["ok"] is False
    assert [(c["name"], c["ok"]) for c in report["checks"]] == [("sh", True), ("surely-not-a-binary-xyz", False)]


def test_shell_completion_is_shown_installed_and_completes(sandbox: Path) -> None:
    import subprocess

    from tests.support.cli import BIN, env_with

    # The shell is detected from the process tree, as it is when a person types the command: bash stays
    # heddle's parent (`bash -c` would exec a last simple command in its place, leaving no shell to find).
    script = ('source <(heddle --show-completion)\n'
              'COMP_WORDS=(heddle ver); COMP_CWORD=1; _heddle_completion heddle; echo "${COMPREPLY[@]}"\n'
              'COMP_WORDS=(heddle cache ""); COMP_CWORD=2; _heddle_completion heddle; echo "${COMPREPLY[@]}"\n'
              'heddle --install-completion\nexit $?\n')
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False,
                          env=env_with({"HOME": str(sandbox / "home"), "PATH": f"{BIN}:/usr/bin:/bin"}))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["verify", "ls prune"]
    assert "bash completion installed in" in proc.stdout
    installed = sandbox / "home" / ".bash_completions" / "heddle.sh"
    assert "_heddle_completion" in installed.read_text()
    assert str(installed) in (sandbox / "home" / ".bashrc").read_text()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Recorder:
    """Each bar a packer starts, with the bytes it then advanced by."""

    def __init__(self) -> None:
        self.bars: list[tuple[str, int, int]] = []

    def start(self, total: int, label: str) -> None:
        self.bars.append((label, total, 0))

    def advance(self, n: int) -> None:
        label, total, done = self.bars[-1]
        self.bars[-1] = (label, total, done + n)

    def finish(self) -> None:
        pass


def test_the_pack_progress_counts_the_bytes_it_says(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    recorder = _Recorder()
    result = pack(agent_plan(paths), sandbox / "app.heddle", progress=recorder)
    payload = result.manifest.total_size
    assert recorder.bars == [("hashing app.heddle", payload, payload), ("packing app.heddle", payload, payload)]


def test_the_bar_writes_binary_units_and_shows_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.cli import output
    from heddle.cli.progress import TerminalProgress, terminal_progress

    stream = _Tty()
    bar = TerminalProgress(stream, min_bytes=0)
    total = int(19.1 * 2**20)
    bar.start(total, "packing app.heddle")
    bar.advance(total)
    bar.finish()
    assert "19.1/19.1 MiB" in stream.getvalue() and " MB" not in stream.getvalue()

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    output.reset()
    assert isinstance(terminal_progress(_Tty()), TerminalProgress)
    assert terminal_progress(io.StringIO()) is None  # not a terminal
    monkeypatch.setenv("NO_COLOR", "")  # set, to any value
    assert terminal_progress(_Tty()) is None
    monkeypatch.delenv("NO_COLOR")
    output.use(quiet=True)
    try:
        assert terminal_progress(_Tty()) is None
    finally:
        output.reset()
