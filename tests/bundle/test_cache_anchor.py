"""The cache is not a trust anchor: a cached tree is proved again on every open, through the
real `heddle` command. Edited tools, planted entries, files swapped with their mtime put back,
caches and trust stores other users can write, tampered files whose digest is cached, dead
staging folders, gzip bombs, leaked temporary folders, and cache paths that are files.

`heddle run` of a cached bundle, `heddle verify`'s refusal of a cache, `heddle cache ls` and
`heddle inspect`'s refusal are each seen from a real process once; the other commands against
the same states run through the entry function in this process (`heddle_here`)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
import zlib
from functools import partial
from pathlib import Path

import pytest

from heddle.format.trust import TrustStore
from heddle.format.verify import verify_bundle, peek
from tests.support.cli import BIN, env_with, error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_tool

from .conftest import VECTORS, KeyPair

NOTES = "sealed notes, twenty-four\n"


def seal(sandbox: Path, keypair: KeyPair) -> Path:
    """A flow whose one tool says who it is and what the ro-mounted notes say, sealed as
    `heddle bundle` seals it (in-process: the commands under test are the ones that open it)."""
    from pathlib import PurePosixPath

    from heddle.bundle.fingerprints import flow_tool_fingerprints
    from heddle.bundle.plan import ToolSpec, make_plan
    from heddle.format.pack import pack
    from heddle.workspace.mounts import Mount

    src = sandbox / "src"
    tools = src / "tools"
    write_tool(tools, "who.py", "out = {'who': 'sealed', 'notes': open('notes/readme.md').read()}")
    f = FlowDoc("anchor")
    s = f.start(["text"])
    t = f.tool_node("who", server_tool("who", ["text"]))
    e = f.end(["who", "notes"])
    f.control(s, t)
    f.control(t, e)
    flow = f.write(src / "flow.json")
    (src / "notes").mkdir()
    (src / "notes" / "readme.md").write_text(NOTES)
    out = sandbox / "app.heddle"
    specs = {name: ToolSpec(tools / f"{name}.py", fp) for name, fp in flow_tool_fingerprints(flow).items()}
    plan = make_plan(flow, tools_dir=tools, tools=specs, mounts=[Mount(src / "notes", PurePosixPath("notes"), "ro")],
                     input={"text": "t"}, name="anchor")
    pack(plan, out, signing_key=keypair.signing)
    return out


def run(bundle: Path, keypair: KeyPair, **kw: object) -> subprocess.CompletedProcess[str]:
    return heddle("run", bundle, "--trust", keypair.pub_path, **kw)  # type: ignore[arg-type]


def run_in_process(bundle: Path, keypair: KeyPair) -> tuple[dict[str, object], str]:
    """What `heddle run BUNDLE --trust KEY` prints, and why it says the cached copy was verified
    again ("" when it was not): the re-open proof is the library's, so most checks of it need no
    process (one real run per test file says it on stderr)."""
    import heddle

    with heddle.open_bundle(bundle, trust=heddle.TrustPolicy.keys(keypair.pub_path)) as opened:
        return heddle.run(opened).state, opened.repaired or ""


def warm(bundle: Path, keypair: KeyPair) -> Path:
    """Open the bundle once into the sandbox's cache; where its cached tree is."""
    return verify_bundle(bundle, trusted_keys=[keypair.public]).root


def unseal(path: Path) -> None:
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)


def reseal(path: Path, mode: int = 0o444) -> None:
    os.chmod(path, mode)
    os.chmod(path.parent, 0o555)


def test_an_edited_cached_tool_never_runs(sandbox: Path, keypair: KeyPair) -> None:
    bundle = seal(sandbox, keypair)
    tool = warm(bundle, keypair) / "tools" / "who.py"
    before = os.stat(tool)
    unseal(tool)
    tool.write_text(tool.read_text().replace("'sealed'", "'edited'"))
    reseal(tool, 0o555)
    os.utime(tool, ns=(before.st_atime_ns, before.st_mtime_ns))
    proc = run(bundle, keypair)
    assert state_of(proc)["who"] == "sealed"
    assert "tools/who.py" in proc.stderr and "verified again" in proc.stderr
    assert "'sealed'" in tool.read_text()


def _planted(sandbox: Path, bundle: Path, keypair: KeyPair) -> Path:
    """An entry under the bundle's digest, made before its first run from a real copy with the
    tool edited, its modes sealed; returns its folder (no snapshot yet)."""
    other = verify_bundle(bundle, trusted_keys=[keypair.public], cache_root=sandbox / "elsewhere")
    entry = sandbox / "cache" / other.digest
    entry.mkdir(mode=0o700)
    shutil.copytree(other.root, entry / "payload")
    tool = entry / "payload" / "tools" / "who.py"
    tool.chmod(0o755)
    tool.write_text(tool.read_text().replace("'sealed'", "'planted'"))
    for top, _dirs, files in os.walk(entry / "payload"):
        for name in files:
            os.chmod(os.path.join(top, name), 0o555 if os.access(os.path.join(top, name), os.X_OK) else 0o444)
    for top, _dirs, _files in sorted(os.walk(entry / "payload"), reverse=True):
        os.chmod(top, 0o555)
    return entry


def test_an_entry_planted_before_the_first_run_is_not_trusted(sandbox: Path, keypair: KeyPair,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bundle = seal(sandbox, keypair)
    # No snapshot at all.
    entry = _planted(sandbox, bundle, keypair)
    state, repaired = run_in_process(bundle, keypair)
    assert state["who"] == "sealed" and "no snapshot" in repaired
    # A snapshot in the right format, checksum and all, describing the planted tree: the
    # tool is re-hashed on every open, so the snapshot's say-so is not enough.
    shutil.rmtree(sandbox / "cache")
    (sandbox / "cache").mkdir()
    from heddle.format.snapshot import FORMAT, record

    entry = _planted(sandbox, bundle, keypair)
    forged = record(entry / "payload", key=entry.name, name="anchor")
    (entry / "snapshot").write_bytes(forged.to_bytes())
    state, repaired = run_in_process(bundle, keypair)
    assert state["who"] == "sealed" and "tools/who.py" in repaired
    # A snapshot that does not belong to its entry is no better.
    (entry / "snapshot").chmod(0o600)
    (entry / "snapshot").write_bytes(b"heddle-snapshot %d " % FORMAT + b"0" * 64 + b"\n{}")
    proc = heddle_here(capsys, "verify", bundle, "--trust", keypair.pub_path, "--json")
    assert proc.returncode == 0 and "checksum" in json.loads(proc.stdout)["repaired"], proc.stderr


def test_a_data_file_swapped_with_its_mtime_put_back_is_caught(sandbox: Path, keypair: KeyPair) -> None:
    bundle = seal(sandbox, keypair)
    notes = warm(bundle, keypair) / "mounts" / "notes" / "readme.md"
    before = os.stat(notes)
    # Same size, new inode, the sealed mode and mtime restored.
    swapped = "forged notes, twenty-four\n"
    assert len(swapped) == len(NOTES)
    os.chmod(notes.parent, 0o755)
    fresh = notes.with_name("new")
    fresh.write_text(swapped)
    os.chmod(fresh, 0o444)
    os.utime(fresh, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(fresh, notes)
    os.chmod(notes.parent, 0o555)
    assert os.stat(notes).st_mtime_ns == before.st_mtime_ns and os.stat(notes).st_size == before.st_size
    state, repaired = run_in_process(bundle, keypair)
    assert state["notes"] == NOTES and "mounts/notes/readme.md" in repaired
    # In place this time (same inode, size and mtime): ctime gives it away.
    before = os.stat(notes)
    unseal(notes)
    notes.write_text(swapped)
    reseal(notes)
    os.utime(notes, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(notes).st_ino == before.st_ino
    state, repaired = run_in_process(bundle, keypair)
    assert state["notes"] == NOTES and "mounts/notes/readme.md" in repaired


def test_a_cache_or_trust_store_others_can_write_is_refused(sandbox: Path, keypair: KeyPair,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = seal(sandbox, keypair)
    shared = sandbox / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    # The command in this process (a cache refusal from a process: test_a_cache_path_that_is_a_file_...).
    with monkeypatch.context() as env:
        env.setenv("HEDDLE_CACHE_DIR", str(shared))
        proc = heddle_here(capsys, "verify", bundle, "--trust", keypair.pub_path)
    assert proc.returncode == 2 and f"run `chmod go-w {shared}`" in error_line(proc)
    assert os.listdir(shared) == []
    # The same check on a cache owned by another user, and on one inside a folder others can
    # write, through the library (the message is the command's error line, as shown above).
    from heddle.errors import UsageError

    shared.chmod(0o700)
    os.chown(shared, 65534, 65534)
    with pytest.raises(UsageError, match=f"`chown {os.geteuid()} {shared}`") as caught:
        verify_bundle(bundle, trusted_keys=[keypair.public], cache_root=shared)
    assert caught.value.exit_code == 2
    # Above a cache of our own, a world-writable folder must be sticky (as /tmp, where every
    # other test's cache lives, is), or another user could swap the cache for theirs.
    parent = sandbox / "open-parent"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(UsageError, match=f"`chmod go-w {parent}`") as caught:
        verify_bundle(bundle, trusted_keys=[keypair.public], cache_root=parent / "mine")
    assert caught.value.exit_code == 2
    assert not (parent / "mine").exists()
    # The trust store: a run trusting the store refuses to read one anyone can add a key to.
    TrustStore().add(keypair.pub_path)
    (sandbox / "trust").chmod(0o777)
    proc = heddle_here(capsys, "run", bundle)  # the command's refusal of a cache, as shown above
    assert proc.returncode == 2
    assert f"trust store {sandbox / 'trust'}" in error_line(proc) and "chmod go-w" in error_line(proc)
    (sandbox / "trust").chmod(0o700)
    key_file = next((sandbox / "trust").glob("*.pub"))
    key_file.chmod(0o666)
    proc = heddle_here(capsys, "trust", "list")  # the same check, in-process
    assert proc.returncode == 2 and f"chmod go-w {key_file}" in error_line(proc)


def _flip(src: Path, dst: Path, needle: bytes) -> None:
    """A copy of `src` with one payload byte changed and the frame rebuilt: same manifest, same
    signatures, so same digest."""
    import zstandard

    data = bytearray(zstandard.ZstdDecompressor().decompress(src.read_bytes()))
    at = data.index(needle)
    data[at] ^= 0x01
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    dst.write_bytes(compressor.compress(bytes(data)))


def test_verify_proves_the_file_even_when_its_digest_is_cached(sandbox: Path, keypair: KeyPair,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bundle = seal(sandbox, keypair)
    warm(bundle, keypair)
    tampered = sandbox / "copy.heddle"
    _flip(bundle, tampered, b"'sealed'")
    assert peek(tampered).digest == peek(bundle).digest
    # `verify`'s exit 6 from a process is tests/bundle/test_cli.py's: the command in this process.
    proc = heddle_here(capsys, "verify", tampered, "--trust", keypair.pub_path)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert "tools/who.py" in error_line(proc) and str(tampered) in error_line(proc)
    # --deep (re-hash the cached tree too) proves the file all the same: what `verify --deep` opens with.
    from heddle.errors import HeddleError

    with pytest.raises(HeddleError, match=r"tools/who\.py") as caught:
        verify_bundle(tampered, trusted_keys=[keypair.public], deep=True, prove_file=True)
    assert caught.value.exit_code == 6 and str(tampered) in caught.value.message
    proc = heddle_here(capsys, "verify", bundle, "--trust", keypair.pub_path)
    assert proc.returncode == 0 and "(already verified)" in proc.stdout


def _hold(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_dead_staging_is_swept_and_the_cache_is_listed_and_pruned(sandbox: Path, keypair: KeyPair,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bundle = seal(sandbox, keypair)
    cache = sandbox / "cache"
    old = time.time() - 3600
    dead = cache / ".staging-dead"
    (dead / "entry" / "payload").mkdir(parents=True)
    (dead / "entry" / "payload" / "half.txt").write_text("half")
    (dead / "entry" / "payload").chmod(0o555)
    (dead / "lock").touch()
    live = cache / ".staging-live"
    live.mkdir()
    held = _hold(live / "lock")
    os.utime(live, (old, old))
    unlocked_old = cache / ".staging-old"
    unlocked_old.mkdir()
    os.utime(unlocked_old, (old, old))
    young = cache / ".staging-young"
    young.mkdir()
    try:
        warm(bundle, keypair)  # an open sweeps the staging nobody holds (the library's, as the commands')
        left = sorted(n for n in os.listdir(cache) if n.startswith("."))
        assert left == [".staging-live", ".staging-young"]
        digest = str(peek(bundle).digest)

        proc = heddle("cache", "ls")
        assert proc.returncode == 0
        assert f"sha256:{digest}" in proc.stdout and "anchor" in proc.stdout and "just now" in proc.stdout
        # `cache ls` through the process; the other readings of the same cache in-process.
        listed = json.loads(heddle_here(capsys, "cache", "ls", "--json", "--cache-dir", cache).stdout)
        assert [(e["digest"], e["name"], e["ok"]) for e in listed] == [(f"sha256:{digest}", "anchor", True)]
        assert listed[0]["size"] == len(NOTES) + sum(
            f.size for f in peek(bundle).manifest.files if not f.path.endswith("readme.md"))

        os.utime(cache / digest / "used", (time.time() - 2 * 86400,) * 2)
        assert "kept 1 entries" in heddle_here(capsys, "cache", "prune").stdout  # 30 days by default
        proc = heddle_here(capsys, "cache", "prune", "--older-than", "1d12h", "--cache-dir", cache)
        assert "removed 1 entries" in proc.stdout and digest in proc.stderr
        assert not (cache / digest).exists()
        # --all also takes staging nobody holds, at any age past its birth; never the one held.
        os.utime(young, (time.time() - 120,) * 2)
        assert "1 staging folders" in heddle_here(capsys, "cache", "prune", "--all").stdout
        assert os.listdir(cache) == [".staging-live"]
    finally:
        os.close(held)
    proc = heddle_here(capsys, "cache", "--help")
    assert proc.returncode == 0
    for word in ("ls", "prune", "--older-than 12h", "--all", "re-hashes"):
        assert word in proc.stdout


def _gzip_bomb(path: Path, inflated: int) -> None:
    """A format-1 bundle whose one big file is `inflated` bytes of zeros, built from one
    compressed block repeated (each after a full flush, so each is the same bytes)."""
    from heddle.format.tar import header

    manifest = json.dumps({"format": 1, "name": "bomb", "flow": "flow.json"}).encode()
    flow = b"{}"
    chunk = 8 << 20
    assert inflated % chunk == 0
    tar_head = header("heddle.json", len(manifest), 0o644, 0) + manifest + bytes(-len(manifest) % 512)
    tar_head += header("zeros.bin", inflated, 0o644, 0)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = [deflate.compress(tar_head) + deflate.flush(zlib.Z_FULL_FLUSH)]
    block = deflate.compress(bytes(chunk)) + deflate.flush(zlib.Z_FULL_FLUSH)
    body += [block] * (inflated // chunk)
    tail = header("flow.json", len(flow), 0o644, 0) + flow + bytes(-len(flow) % 512) + bytes(1024)
    body.append(deflate.compress(tail) + deflate.flush())
    crc = zlib.crc32(tar_head)
    zeros = bytes(chunk)
    for _ in range(inflated // chunk):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(tail, crc)
    size = (len(tar_head) + inflated + len(tail)) & 0xFFFFFFFF
    path.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"".join(body)
                     + crc.to_bytes(4, "little") + size.to_bytes(4, "little"))


def test_a_legacy_gzip_bomb_meets_the_same_ratio_cap(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = sandbox / "bomb.heddle"
    _gzip_bomb(bomb, 96 << 20)
    assert zlib.decompressobj(31).decompress(bomb.read_bytes(), 4096)  # a real gzip stream
    ratio = (96 << 20) / bomb.stat().st_size
    assert 1000 < ratio and bomb.stat().st_size < 200_000
    # `inspect` through the process, `verify` (the same peek) in-process.
    in_process = partial(heddle_here, capsys)
    for command, call in ((("inspect", bomb), heddle), (("verify", bomb, "--allow-unsigned"), in_process)):
        proc = call(*command)
        assert proc.returncode == 7, proc.stdout + proc.stderr
        assert "over the cap of 1000:1" in error_line(proc) and "Traceback" not in proc.stderr
    assert not (sandbox / "cache").exists() or os.listdir(sandbox / "cache") == []


def test_a_run_leaves_nothing_in_tmpdir(sandbox: Path, keypair: KeyPair, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    bundle = seal(sandbox, keypair)
    tmp = sandbox / "tmp"
    tmp.mkdir()
    # The command in this process, its temporary folder (and its tools') under TMPDIR as a
    # process started with it would have; checked before anything this process might tidy at exit.
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() == str(tmp)
    assert state_of(heddle_here(capsys, "run", bundle, "--trust", keypair.pub_path))["who"] == "sealed"
    assert os.listdir(tmp) == []


def test_a_cached_format_1_bundle_is_not_unpacked_again(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    legacy = VECTORS / "legacy-gzip.heddle"
    assert not verify_bundle(legacy, trusted_keys=[], allow_unsigned=True).cached  # unpacked into the cache

    def no_file_writes() -> None:
        # Any write of file data fails (EFBIG) instead of killing the process.
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    argv = [str(BIN / "heddle"), "verify", str(legacy), "--allow-unsigned", "--json"]
    again = subprocess.run(argv, capture_output=True, text=True, env=env_with(), preexec_fn=no_file_writes,
                           stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["cached"]
    # ... and its cached tree gets the same re-open proof as a sealed bundle's.
    root = Path(json.loads(again.stdout)["root"])
    tool = root / "tools" / "echo.py"
    unseal(tool)
    tool.write_text(tool.read_text() + "\n# edited\n")
    reseal(tool, 0o555)
    proc = heddle_here(capsys, "run", legacy, "--allow-unsigned")  # `heddle run`'s process: the first test
    assert state_of(proc) == {"text": "hi", "echoed": "hi"}
    assert "tools/echo.py" in proc.stderr and "edited" not in tool.read_text()


@pytest.mark.parametrize("where", ["root", "entry"])
def test_a_cache_path_that_is_a_file_is_a_clear_error(sandbox: Path, keypair: KeyPair, where: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bundle = seal(sandbox, keypair)
    if where == "root":
        path = sandbox / "not-a-folder"
        path.write_text("")
        proc = heddle("verify", bundle, "--trust", keypair.pub_path, env={"HEDDLE_CACHE_DIR": str(path)})
    else:
        path = sandbox / "cache" / str(peek(bundle).digest)
        path.write_text("")
        # `heddle run` opens its cache as `verify` does (through the process just above): in-process.
        proc = heddle_here(capsys, "run", bundle, "--trust", keypair.pub_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and f"{path} is a file" in error_line(proc)
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_snapshot_belongs_to_one_entry_and_parses_only_as_written(sandbox: Path, keypair: KeyPair) -> None:
    from heddle.format.snapshot import Snapshot, SnapshotError

    root = warm(seal(sandbox, keypair), keypair)
    key = root.parent.name
    data = (root.parent / "snapshot").read_bytes()
    assert Snapshot.from_bytes(data, key).name == "anchor"
    head, body = data.split(b"\n", 1)
    nested = b"[" * 100_000 + b"]" * 100_000
    for bad, why in ((data, "checksum"), (head + b"\n" + body[:-1], "checksum"), (b"", "not a heddle snapshot"),
                     (head.replace(b" 2 ", b" 1 ") + b"\n" + body, "format")):
        with pytest.raises(SnapshotError, match=why):
            Snapshot.from_bytes(bad, key if bad is not data else "0" * 64)
    # Sealed for this key, but not what heddle writes: refused as such, never a traceback.
    from heddle.format import snapshot as module

    one, two = (b'"%s"' % base64.b64encode(b"\1" * n) for n in (8, 16))  # one 64-bit value, and two
    columns = b'"path":["p"],"mode":%s,"size":%s,"dev":%s,"ino":%s,"mtime_ns":%s,"ctime_ns":%s'
    body = b'{"format":2,"key":"%s","name":"a","dirs":[],"files":%s}'
    for raw in (nested, b'{"format": 2}', body % (key.encode(), b'[["p",33060,1,1,1,1,1]]'),  # format 1's rows
                body % (key.encode(), b"{" + columns % (one, one, one, one, one, two) + b"}"),  # two lengths
                body % (key.encode(), b"{" + columns % (one, one, one, one, one, b'"AQ=="') + b"}"),  # a byte
                body % (key.encode(), b"{" + columns % (one, one, one, one, one, b"[1]") + b"}"),  # not bytes
                body % (key.encode(), b"{" + columns % (one, one, one, one, one, b'"A!=="') + b"}")):  # not base64
        sealed = b"%s %d %s\n%s" % (module.MAGIC, module.FORMAT, module._seal(key, raw).encode(), raw)
        with pytest.raises(SnapshotError):
            Snapshot.from_bytes(sealed, key)


def test_cache_folders_are_made_private_whatever_the_umask(sandbox: Path) -> None:
    from heddle.cli.bundle import parse_duration
    from heddle.format.private import make_private_dir

    old = os.umask(0)
    try:
        made = make_private_dir(sandbox / "a" / "b" / "c", what="cache folder", setting="--cache-dir")
    finally:
        os.umask(old)
    for folder in (sandbox / "a", sandbox / "a" / "b", made):
        assert os.stat(folder).st_mode & 0o777 == 0o700
    assert [parse_duration(t) for t in ("30d", "12h", "90m", "45s", "1d12h")] == [
        30 * 86400, 12 * 3600, 90 * 60, 45, 36 * 3600]
    # What `heddle cache prune --older-than soon` refuses with (exit 2, on its error line).
    from heddle.errors import UsageError

    with pytest.raises(UsageError, match="30d, 12h, 90m or 45s") as caught:
        parse_duration("soon")
    assert caught.value.exit_code == 2
