"""Packing: checks before writing, deterministic bytes, atomic output, and a round trip."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path, PurePosixPath

import pytest

from heddle.format.errors import PackError
from heddle.bundle.fingerprints import flow_tool_fingerprints
from heddle.bundle.plan import ToolSpec, make_plan
from heddle.format.pack import PackPlan, pack
from heddle.format.verify import verify_bundle, peek
from heddle.workspace.mounts import Mount

from .conftest import KeyPair, agent_plan, snapshot, write_agent


def _touch_all(root: Path, when: float) -> None:
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            os.utime(os.path.join(top, name), (when, when))


def test_same_tree_packed_twice_gives_identical_bytes(sandbox: Path, keypair: KeyPair) -> None:
    first = write_agent(sandbox / "a")
    out1 = sandbox / "one.heddle"
    # The time a signature is made is sealed with it: given the same, the whole file is the same.
    at = "2026-01-02T03:04:05.000006Z"
    pack(agent_plan(first), out1, signing_key=keypair.signing, signed_at=at)

    # The same content elsewhere, created in another order, other mtimes, another umask.
    old = os.umask(0o077)
    try:
        second = write_agent(sandbox / "b")
        (second["notes"] / "readme.md").unlink()
        time.sleep(0.01)
        (second["notes"] / "readme.md").write_text("# notes\n")
        _touch_all(sandbox / "b", 1_000_000)
        out2 = sandbox / "two.heddle"
        pack(agent_plan(second), out2, signing_key=keypair.signing, signed_at=at)
    finally:
        os.umask(old)
    assert out1.read_bytes() == out2.read_bytes()


def test_source_date_epoch_sets_every_mtime(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zstandard

    paths = write_agent(sandbox / "agent")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a, b = sandbox / "a.heddle", sandbox / "b.heddle"
    pack(agent_plan(paths), a)
    pack(agent_plan(paths), b)
    assert a.read_bytes() == b.read_bytes()
    tar = zstandard.ZstdDecompressor().decompress(a.read_bytes())
    mtimes = {tar[i + 136 : i + 147] for i in range(0, len(tar) - 1024, 512) if tar[i + 257 : i + 262] == b"ustar"}
    assert mtimes == {format(1_700_000_000, "o").rjust(11, "0").encode()}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(Exception, match="SOURCE_DATE_EPOCH"):
        pack(agent_plan(paths), sandbox / "c.heddle")
    assert not (sandbox / "c.heddle").exists()


def test_round_trip_layout_and_skipped_git_folders(sandbox: Path, keypair: KeyPair) -> None:
    paths = write_agent(sandbox / "agent")
    (paths["tools"] / ".git").mkdir()
    (paths["tools"] / ".git" / "config").write_text("[core]\n")
    plan = agent_plan(paths, input={"text": "hi"})
    result = pack(plan, sandbox / "app.heddle", signing_key=keypair.signing)
    assert sorted(str(p.relative_to(sandbox / "agent")) for p in result.skipped) == ["notes/.git", "tools/.git"]
    assert result.signer == keypair.signing.keyid
    opened = verify_bundle(sandbox / "app.heddle", trusted_keys=[keypair.public], tool_fingerprints=flow_tool_fingerprints)
    assert opened.digest == result.digest
    m = opened.manifest
    assert [f.path for f in m.files] == [
        "flow.json", "mounts/notes/readme.md", "mounts/notes/sub/deep.txt", "mounts/work/draft.txt", "tools/echo.py",
    ]
    assert m.tools["echo"].entry == "tools/echo.py"
    assert [(x.dest, x.prefix, x.mode) for x in m.mounts] == [("notes", "mounts/notes", "ro"), ("work", "mounts/work", "rw")]
    assert dict(m.input) == {"text": "hi"}
    assert (opened.root / "tools/echo.py").read_bytes() == (paths["tools"] / "echo.py").read_bytes()
    assert os.access(opened.tool_path("echo"), os.X_OK)
    assert opened.tools_dir == opened.root / "tools"


@pytest.mark.parametrize("make_bad, message", [
    (lambda d: os.symlink("/etc/passwd", d / "link"), "symbolic link"),
    (lambda d: os.mkfifo(d / "pipe"), "FIFO"),
    (lambda d: socket.socket(socket.AF_UNIX).bind(str(d / "sock")), "socket"),
])
def test_links_fifos_and_sockets_are_refused_naming_them(sandbox: Path, make_bad, message: str) -> None:
    paths = write_agent(sandbox / "agent")
    make_bad(paths["notes"] / "sub")
    out = sandbox / "app.heddle"
    out.write_bytes(b"the previous bundle")
    with pytest.raises(PackError, match=message) as caught:
        pack(agent_plan(paths), out)
    assert str(paths["notes"] / "sub") in caught.value.message
    assert out.read_bytes() == b"the previous bundle"


def test_failure_leaves_nothing_at_out(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    plan = agent_plan(paths, input={"temperature": 0.5})
    before = snapshot(sandbox)
    with pytest.raises(PackError, match="float"):
        pack(plan, sandbox / "app.heddle")
    assert snapshot(sandbox) == before


@pytest.mark.parametrize("kept", [False, True])
def test_a_file_changing_while_packed_is_refused_or_sealed_as_hashed(
        sandbox: Path, kept: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file kept from the hashing read is written from it (read once): what is sealed is what was
    hashed, whatever happens to the file after. A file read again to be written must not have changed."""
    import heddle.format.pack as packing

    paths = write_agent(sandbox / "agent")
    plan = agent_plan(paths)
    before = (paths["work"] / "draft.txt").read_bytes()
    if not kept:
        monkeypatch.setattr(packing, "_KEEP_FILE", -1)
    reads: list[str] = []
    real_open = os.open
    monkeypatch.setattr(packing.os, "open",
                        lambda path, *a, **k: (reads.append(str(path)), real_open(path, *a, **k))[1])

    class ChangeWhenHashed:
        """Appends to a source once every byte has been hashed, before it is written."""

        def start(self, total: int, label: str) -> None:
            # The first pass hashes every byte; the second writes them.
            self.left = total if label.startswith("hashing") else -1

        def advance(self, n: int) -> None:
            self.left -= n
            if self.left == 0:
                with open(paths["work"] / "draft.txt", "a") as fh:
                    fh.write("more\n")

        def finish(self) -> None:
            pass

    if kept:
        pack(plan, sandbox / "app.heddle", progress=ChangeWhenHashed())
        sources = sorted(str(f.source) for f in plan.files)
        assert sorted(r for r in reads if r in sources) == sources  # each source opened once
        opened = verify_bundle(sandbox / "app.heddle", trusted_keys=[], allow_unsigned=True,
                               tool_fingerprints=flow_tool_fingerprints)
        assert (opened.root / "mounts/work/draft.txt").read_bytes() == before
        return
    with pytest.raises(PackError, match="changed while it was being packed"):
        pack(plan, sandbox / "app.heddle", progress=ChangeWhenHashed())
    assert sorted(os.listdir(sandbox)) == ["agent", "cache", "home", "trust"]


def test_plan_refusals_name_the_source(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    (paths["notes"] / "Readme.md").write_text("twin\n")
    with pytest.raises(PackError, match="case folding") as caught:
        agent_plan(paths)
    assert "Readme.md" in caught.value.message

    (paths["notes"] / "Readme.md").unlink()
    (paths["notes"] / "con.txt").write_text("device\n")
    with pytest.raises(PackError, match="reserved device name"):
        agent_plan(paths)
    (paths["notes"] / "con.txt").unlink()

    with pytest.raises(PackError, match="reserves"):
        agent_plan(paths, mounts=[Mount(paths["notes"], PurePosixPath(".heddle/x"), "ro")])
    with pytest.raises(PackError, match="overlaps"):
        from heddle.format.pack import pack as _pack

        _pack(agent_plan(paths, mounts=[Mount(paths["notes"], PurePosixPath("a"), "ro"),
                                        Mount(paths["work"], PurePosixPath("a/b"), "rw")]), sandbox / "x.heddle")
    assert not (sandbox / "x.heddle").exists()


def test_every_tool_the_flow_names_must_be_carried(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    fps = flow_tool_fingerprints(paths["flow"])
    with pytest.raises(PackError, match="no --tools-dir"):
        make_plan(paths["flow"], tools={"echo": ToolSpec(paths["tools"] / "echo.py", fps["echo"])})
    (paths["tools"] / ".git").mkdir()
    hidden = paths["tools"] / ".git" / "echo.py"
    hidden.write_text("x")
    with pytest.raises(PackError, match="not carried"):
        make_plan(paths["flow"], tools_dir=paths["tools"], tools={"echo": ToolSpec(hidden, fps["echo"])})


def test_plugins_are_carried_as_folders(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    plugin = sandbox / "agent" / "plug"
    plugin.mkdir()
    (plugin / "plugin.json").write_text('{"name": "greeter", "entry": "main.py"}')
    (plugin / "main.py").write_text("print('hi')\n")
    result = pack(agent_plan(paths, plugins=[plugin / "plugin.json"]), sandbox / "p.heddle")
    m = peek(result.path).manifest
    assert [(p.name, p.dir, p.manifest) for p in m.plugins] == [("greeter", "plugins/greeter", "plugins/greeter/plugin.json")]
    assert "plugins/greeter/main.py" in m.by_path


def test_progress_is_a_bar_on_a_terminal_and_silent_in_a_pipe(sandbox: Path, keypair: KeyPair) -> None:
    import io

    from heddle.cli.progress import TerminalProgress, terminal_progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert terminal_progress(io.StringIO()) is None
    assert isinstance(terminal_progress(Terminal()), TerminalProgress)
    paths = write_agent(sandbox / "agent")
    screen = Terminal()
    pack(agent_plan(paths), sandbox / "app.heddle", progress=TerminalProgress(screen, min_bytes=0))
    assert "packing app.heddle" in screen.getvalue()
    screen = Terminal()
    verify_bundle(sandbox / "app.heddle", trusted_keys=[], allow_unsigned=True,
                progress=TerminalProgress(screen, min_bytes=0))
    assert "verifying app.heddle" in screen.getvalue()
    quiet = Terminal()
    pack(agent_plan(paths), sandbox / "small.heddle", progress=TerminalProgress(quiet, min_bytes=1 << 30))
    assert quiet.getvalue() == ""


def _sizable_plan(root: Path) -> PackPlan:
    """About 6 MiB, half random and half text: three zstd jobs at level 1, so the bytes show
    whether they depend on how many workers compressed them."""
    import random

    from heddle.format.pack import PlanFile

    rng = random.Random(15)
    root.mkdir()
    (root / "flow.json").write_text("{}\n")
    files = [PlanFile("flow.json", root / "flow.json")]
    text = " ".join(rng.choice(("seal", "verify", "tool", "flow", "mount")) for _ in range(20_000)).encode() * 20
    for i in range(3):
        (root / f"part{i}").write_bytes(rng.randbytes(1 << 20) + text[i : i + (1 << 20)])
        files.append(PlanFile(f"data/part{i}", root / f"part{i}"))
    return PackPlan(name="sizable", flow="flow.json", files=files)


def test_the_bytes_depend_on_the_level_never_on_the_threads(sandbox: Path) -> None:
    from heddle.format.archive import ArchiveWriter

    plan = _sizable_plan(sandbox / "tree")
    one, three, default = sandbox / "one.heddle", sandbox / "three.heddle", sandbox / "default.heddle"
    digest = pack(plan, one, level=1, threads=1).digest
    assert pack(plan, three, level=1, threads=3).digest == digest
    assert one.read_bytes() == three.read_bytes()
    assert pack(plan, default).digest == digest and default.read_bytes() != one.read_bytes()
    assert verify_bundle(one, trusted_keys=[], allow_unsigned=True).digest == digest
    # Files of 2 MiB span the reader's buffers as they are written: every cached byte is re-hashed
    # and every snapshot row must be there.
    again = verify_bundle(one, trusted_keys=[], allow_unsigned=True, deep=True)
    assert again.cached and again.repaired is None
    with open(os.devnull, "wb") as sink, pytest.raises(ValueError, match="one zstd worker thread or more"):
        ArchiveWriter(sink, total=0, threads=0)  # zstd's single-threaded mode writes other bytes


def test_the_level_is_a_setting_checked_before_anything_is_written(
    sandbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from heddle.errors import UsageError
    from tests.support.cli_inproc import heddle_inproc

    paths = write_agent(sandbox / "agent")
    for level, message in (("23", "--level 23: must be at most 22"), ("0", "--level 0: must be at least 1"),
                           ("fast", "--level: 'fast' is not a whole number")):
        rc, _, err = heddle_inproc(capsys, "bundle", paths["flow"], "-t", paths["tools"], "--level", level,
                                   "-o", sandbox / "app.heddle")
        assert rc == 2 and err.strip() == f"error: {message}"
    assert not (sandbox / "app.heddle").exists()
    rc, out, _ = heddle_inproc(capsys, "bundle", paths["flow"], "-t", paths["tools"], "--level", "19",
                               "-o", sandbox / "app.heddle", "--json")
    assert rc == 0 and json.loads(out)["bundle"] == str(sandbox / "app.heddle")
    with pytest.raises(UsageError, match="must be at most 22"):
        pack(agent_plan(paths), sandbox / "lib.heddle", level=30)


def test_planning_and_packing_open_each_file_once(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret screen, the hash and the write all come from one read of each file (the flow
    document is also read by the plan, which checks it for keys written in it)."""
    paths = write_agent(sandbox / "agent")
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(os.fspath(path)), real_open(path, *a, **k))[1])
    plan = agent_plan(paths)
    pack(plan, sandbox / "app.heddle")
    sources = sorted(str(f.source) for f in plan.files if f.source != paths["flow"])
    assert sources and sorted(p for p in opened if p in sources) == sources


def test_a_small_file_is_opened_stat_ed_and_read_once(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Packing many small files is system calls a file: one open, one fstat and one read bring its hash,
    its screen and the bytes written."""
    paths = write_agent(sandbox / "agent")
    plan = agent_plan(paths)
    sources = {os.fspath(f.source) for f in plan.files}
    calls: dict[int, list[str]] = {}
    real = {name: getattr(os, name) for name in ("open", "fstat", "read", "readv")}

    def opening(path: object, *a: object, **k: object) -> int:
        fd: int = real["open"](path, *a, **k)
        if os.fspath(path) in sources:  # type: ignore[call-overload]
            calls[fd] = []
        return fd

    def counted(name: str):  # type: ignore[no-untyped-def]
        def call(fd: int, *a: object, **k: object) -> object:
            if fd in calls:
                calls[fd].append(name)
            return real[name](fd, *a, **k)
        return call

    closed: list[list[str]] = []
    monkeypatch.setattr(os, "open", opening)
    for name in ("fstat", "read", "readv"):
        monkeypatch.setattr(os, name, counted(name))
    monkeypatch.setattr(os, "close", lambda fd, close=os.close: (fd in calls and closed.append(calls.pop(fd)),
                                                                  close(fd))[1])
    pack(plan, sandbox / "app.heddle")
    assert len(closed) == len(sources) and all(c == ["fstat", "read"] for c in closed), closed


def test_sealing_holds_off_the_cyclic_collector(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan and a manifest of a big tree are many small objects in no cycle: the collector is held off
    while they are made (its passes over them were a tenth of packing 30,000 files), then left as it was."""
    import gc

    import heddle
    import heddle.bundle.seal as sealing

    paths = write_agent(sandbox / "agent")
    enabled: list[bool] = []
    real_plan, real_pack = sealing.make_plan, sealing.pack
    monkeypatch.setattr(sealing, "make_plan", lambda *a, **k: (enabled.append(gc.isenabled()), real_plan(*a, **k))[1])
    monkeypatch.setattr(sealing, "pack", lambda *a, **k: (enabled.append(gc.isenabled()), real_pack(*a, **k))[1])
    assert gc.isenabled()
    heddle.seal(paths["flow"], output=sandbox / "app.heddle", tools_dir=paths["tools"], mounts=[f"{paths['work']}:work"])
    assert enabled == [False, False] and gc.isenabled()


def test_sealing_walks_a_mount_once_counting_its_limits_there(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mount limits are counted by the plan's own walk of a mount, which lists each of its folders once
    (the mount rules' walk and the plan's listed each twice); its .git folder counts though it is not carried,
    and a link in it is refused as the mount rules refuse one."""
    import heddle
    from heddle.errors import UsageError

    paths = write_agent(sandbox / "agent")
    notes = paths["notes"]  # readme.md (8 bytes), sub/, sub/deep.txt (5), .git/, .git/HEAD (21): 6 entries with itself
    listed: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: (listed.append(os.fspath(path)), real_scandir(path))[1])

    def seal(**limits: int) -> None:
        heddle.seal(paths["flow"], output=sandbox / "app.heddle", tools_dir=paths["tools"],
                    mounts=[f"{notes}:notes"], **limits)

    seal(mount_max_entries=6, mount_max_bytes=34)
    mine = [p for p in listed if p.startswith(str(notes))]
    assert sorted(mine) == sorted({str(notes), str(notes / "sub"), str(notes / ".git")})
    with pytest.raises(UsageError, match="more than 5 files and folders"):
        seal(mount_max_entries=5)
    with pytest.raises(UsageError, match="more than 33 bytes"):
        seal(mount_max_bytes=33)
    os.symlink("/etc/passwd", notes / ".git" / "link")
    with pytest.raises(UsageError, match=r"\.git/link is a symlink; mounts carry only regular files and folders"):
        seal()


def test_small_files_are_hashed_on_the_calling_thread(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of a few KiB is Python's work and system calls under the interpreter's lock: threads would pass
    the lock to and fro for nothing. Batches of such files are hashed by the caller; bigger files on the pool
    (the same bytes either way)."""
    import concurrent.futures

    pools: list[int] = []
    real_pool = concurrent.futures.ThreadPoolExecutor

    class Counted(real_pool):  # type: ignore[misc, valid-type]
        def __init__(self, *a: object, **k: object) -> None:
            pools.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", Counted)
    paths = write_agent(sandbox / "agent")
    one, two = sandbox / "one.heddle", sandbox / "two.heddle"
    at = "2026-01-02T03:04:05.000006Z"
    pack(agent_plan(paths), one, threads=1, signed_at=at)
    pack(agent_plan(paths), two, threads=2, signed_at=at)
    assert pools == [] and one.read_bytes() == two.read_bytes()
    big = _sizable_plan(sandbox / "tree")
    pack(big, sandbox / "big.heddle", threads=2)
    assert pools == [1]


def test_the_bundle_command_imports_no_engine_nor_http_client(sandbox: Path, keypair: KeyPair) -> None:
    """Sealing checks the document, its tools and its keys; it runs nothing, so `heddle bundle` loads neither
    the engine's run and the run core, nor the HTTP client and the event loop, nor the commands' module
    without a commands file, nor a thread pool for a few small files, nor cryptography's key serialization
    for a key as `heddle keygen` writes it (what is imported, never timed)."""
    import subprocess
    import sys

    paths = write_agent(sandbox / "agent")
    check = ("import atexit, json, sys\n"
             "atexit.register(lambda: print(json.dumps(sorted(m for m in ('httpx', 'asyncio', 'heddle.core', "
             "'heddle.engine.run', 'heddle.tools.remote', 'heddle.tools.commands', 'concurrent.futures', "
             "'cryptography.hazmat.primitives.serialization') if m in sys.modules))))\n"
             "sys.argv = ['heddle', 'bundle', *sys.argv[1:]]\n"
             "from heddle.cli import main\n"
             "main()\n")
    proc = subprocess.run([sys.executable, "-c", check, str(paths["flow"]), "-t", str(paths["tools"]),
                           "--mount", f"{paths['notes']}:notes", "--sign-key", str(keypair.key_path),
                           "-o", str(sandbox / "app.heddle")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []
    assert verify_bundle(sandbox / "app.heddle", trusted_keys=[keypair.public]).signers == [keypair.signing.keyid]
