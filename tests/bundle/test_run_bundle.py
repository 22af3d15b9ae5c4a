"""`heddle bundle` and `heddle run X.heddle` end to end, through the real command.

Each command's success and refusal is seen from a real process (`heddle bundle` and `heddle run`
of a bundle in test_bundle_then_run_exactly_what_was_sealed, their refusals in
test_a_failed_bundle_leaves_nothing_at_the_output and test_untrusted_and_tampered_bundles_never_run);
the other flags and refusals run the same entry function in this process (`heddle_here`), which
prints the same lines and returns the same status without a process start each.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from heddle import HeddleError
from heddle import seal as seal_in_process
from heddle.format.verify import peek
from tests.bundle.conftest import VECTORS, KeyPair, make_keypair
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.users import OtherUser, made_by, other_user  # noqa: F401 (a fixture)


def project(root: Path) -> tuple[Path, Path]:
    """A flow whose one tool reads a mounted file, appends to an rw mount and echoes its input."""
    tools = root / "tools"
    write_tool(tools, "work.py", (
        "notes = open('notes/readme.md', encoding='utf-8').read().strip()\n"
        "with open('data/log.txt', 'a', encoding='utf-8') as fh:\n    fh.write(args['text'] + '\\n')\n"
        "lines = open('data/log.txt', encoding='utf-8').read().split()\n"
        "out = {'notes': notes, 'lines': lines}"))
    f = FlowDoc("sealed-work")
    s = f.start(["text"])
    t = f.tool_node("work", server_tool("work", ["text"]))
    e = f.end(["notes", "lines"])
    f.control(s, t)
    f.control(t, e)
    flow = f.write(root / "flow.json")
    (root / "notes").mkdir()
    (root / "notes" / "readme.md").write_text("sealed notes ✓\n", encoding="utf-8")
    (root / "data").mkdir()
    (root / "data" / "log.txt").write_text("seed\n")
    return flow, tools


def seal(sandbox: Path, keypair, *extra: str) -> Path:
    flow, tools = project(sandbox / "src")
    out = sandbox / "app.heddle"
    proc = heddle("bundle", flow, "--tools-dir", tools, "--mount", f"{sandbox / 'src' / 'notes'}",
                  "--mount", f"{sandbox / 'src' / 'data'}:data:rw", "--input", '{"text": "recorded"}',
                  "--sign-key", keypair.key_path, "-o", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return out


@dataclass(frozen=True)
class Sealed:
    """The project from `project`, sealed once for the module as `seal` does, in-process: the
    tests sharing it are about running a bundle (`heddle bundle` itself has its own tests)."""

    bundle: Path
    src: Path
    keypair: KeyPair


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Sealed:
    root = tmp_path_factory.mktemp("sealed")
    (root / "keys").mkdir()
    keypair = make_keypair(root / "keys", "me")
    src = root / "src"
    src.mkdir()
    flow, tools = project(src)
    out = root / "app.heddle"
    seal_in_process(flow, tools_dir=tools, mounts=[str(src / "notes"), f"{src / 'data'}:data:rw"],
                    input={"text": "recorded"}, sign_key=keypair.signing, output=out)
    out.chmod(0o444)  # shared by every test of the module: none may change it
    return Sealed(out, src, keypair)


def test_bundle_then_run_exactly_what_was_sealed(sandbox, keypair, capsys):
    (sandbox / "src").mkdir()
    out = seal(sandbox, keypair)
    # The commands after the first run read the same sealed state: in-process, same entry point.
    proc = heddle_here(capsys, "bundle", "--help")
    assert "--sign-key" in proc.stdout
    # Editing the source after sealing changes nothing; the recorded input is the one used.
    (sandbox / "src" / "notes" / "readme.md").write_text("changed\n")
    state = state_of(heddle("run", out, "--trust", keypair.pub_path))
    assert state["notes"] == "sealed notes ✓" and state["lines"] == ["seed", "recorded"]
    # --input replaces the recorded input
    state = state_of(heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"text": "given"}'))
    assert state["lines"] == ["seed", "given"]
    report = heddle_here(capsys, "validate", out, "--trust", keypair.pub_path)
    assert report.returncode == 0 and "graph     valid" in report.stdout


def test_rw_mounts_are_seeded_into_a_data_dir_never_the_cache(sandbox, sealed, capsys):
    out, keypair = sealed.bundle, sealed.keypair
    data = sandbox / "data-dir"
    proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--data-dir", data, "--input",
                       '{"text": "one"}')
    assert state_of(proc)["lines"] == ["seed", "one"]
    assert f"rw mounts are seeded in {data}" in proc.stderr
    # The next run in the same data dir (what --data-dir opens with) goes on from there.
    import heddle as library

    with library.open_bundle(out, trust=library.TrustPolicy.keys(keypair.pub_path), data_dir=data) as bundle:
        assert bundle.data_dir == data
        assert library.run(bundle, inputs={"text": "two"}).state["lines"] == ["seed", "one", "two"]
    assert (data / "data" / "log.txt").read_text().split() == ["seed", "one", "two"]
    # without --data-dir each run starts from the sealed seed, in a folder it names
    proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path)
    assert state_of(proc)["lines"] == ["seed", "recorded"] and "rw mounts are seeded in " in proc.stderr
    cache = sandbox / "cache"
    for top, _dirs, files in os.walk(cache):
        for name in files:
            st = os.stat(os.path.join(top, name))
            assert not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), name
            if name == "log.txt":
                assert Path(top, name).read_text() == "seed\n"


def test_a_run_removes_the_data_folder_it_made(sandbox, sealed):
    # The real command, with a temporary folder of its own: what it made there is gone when it ends.
    tmp = sandbox / "tmp"
    tmp.mkdir(mode=0o700)
    proc = heddle("run", sealed.bundle, "--trust", sealed.keypair.pub_path, env={"TMPDIR": str(tmp)})
    assert state_of(proc)["lines"] == ["seed", "recorded"]
    assert f"rw mounts are seeded in {tmp}/heddle-data-" in proc.stderr
    assert "(removed when the command ends; --data-dir DIR keeps them)" in proc.stderr
    assert list(tmp.iterdir()) == []
    # ... and when the run fails.
    proc = heddle("run", sealed.bundle, "--trust", sealed.keypair.pub_path, "--input", '{"text": 5}',
                  env={"TMPDIR": str(tmp)})
    assert proc.returncode != 0 and list(tmp.iterdir()) == []


def test_a_data_dir_another_user_could_change_is_refused(sandbox, sealed, other_user: OtherUser,  # noqa: F811
                                                         capsys):
    shared = sandbox / "shared"
    shared.mkdir()
    theirs = made_by(other_user, shared, "data")
    proc = heddle_here(capsys, "run", sealed.bundle, "--trust", sealed.keypair.pub_path, "--data-dir", theirs)
    assert proc.returncode == 2
    assert error_line(proc) == (
        f"error: data folder {theirs} is owned by uid {other_user.uid}, not by you (uid {os.geteuid()}), so its "
        f"owner could change what heddle trusts; run `chown {os.geteuid()} {theirs}` or point --data-dir at a "
        "folder of your own")
    assert list(theirs.iterdir()) == []  # nothing seeded there
    mine = sandbox / "mine"
    mine.mkdir(mode=0o770)
    mine.chmod(0o770)
    proc = heddle_here(capsys, "run", sealed.bundle, "--trust", sealed.keypair.pub_path, "--data-dir", mine)
    assert proc.returncode == 2 and f"run `chmod go-w {mine}`" in error_line(proc)
    # A new one is made the user's alone.
    new = sandbox / "new" / "data"
    proc = heddle_here(capsys, "run", sealed.bundle, "--trust", sealed.keypair.pub_path, "--data-dir", new)
    assert state_of(proc)["lines"] == ["seed", "recorded"]
    assert stat.S_IMODE(new.stat().st_mode) == stat.S_IMODE((sandbox / "new").stat().st_mode) == 0o700


def test_tools_dir_with_a_bundle_is_refused(sandbox, sealed, capsys):
    proc = heddle_here(capsys, "run", sealed.bundle, "--trust", sealed.keypair.pub_path, "--tools-dir",
                       sealed.src / "tools")
    assert proc.returncode == 2
    assert "--tools-dir cannot be used with the bundle" in error_line(proc)
    # A flow document given with --trust (exit 7, "apply to bundles"): see
    # tests/bundle/test_disguised.py::test_a_flow_named_heddle_or_given_with_trust_is_refused_not_run.


def test_a_mount_given_at_run_time_adds_to_the_bundles(sandbox, keypair, capsys):
    (sandbox / "src").mkdir()
    flow, tools = project(sandbox / "src")
    write_tool(tools, "work.py", "out = {'extra': open('extra/x.txt').read(), 'notes': os.listdir('notes'), "
                                 "'lines': []}")
    out = sandbox / "app.heddle"
    seal_in_process(flow, tools_dir=tools, mounts=[str(sandbox / "src" / "notes")], sign_key=keypair.signing,
                    output=out)
    (sandbox / "extra").mkdir()
    (sandbox / "extra" / "x.txt").write_text("added")
    state = state_of(heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--mount", sandbox / "extra",
                                 "--input", '{"text": "t"}'))
    assert state["extra"] == "added" and state["notes"] == ["readme.md"]


def test_git_folders_are_left_out_and_listed(sandbox, keypair, capsys):
    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    (src / "notes" / ".git").mkdir()
    (src / "notes" / ".git" / "config").write_text("[core]\n")
    out = sandbox / "app.heddle"
    proc = heddle_here(capsys, "bundle", flow, "-t", tools, "--mount", src / "notes", "--mount",
                       f"{src / 'data'}:data:rw", "--sign-key", keypair.key_path, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert f"left out {src / 'notes' / '.git'}" in proc.stderr
    listing = [f.path for f in peek(out).manifest.files]
    assert "mounts/notes/readme.md" in listing and not any(".git" in path for path in listing)


def test_a_failed_bundle_leaves_nothing_at_the_output(sandbox, keypair):
    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    out = sandbox / "app.heddle"
    (src / "notes" / "link").symlink_to("/etc/passwd")
    proc = heddle("bundle", flow, "-t", tools, "--mount", src / "notes", "--sign-key", keypair.key_path, "-o", out)
    assert proc.returncode == 2 and "link" in error_line(proc)
    assert not out.exists()
    (src / "notes" / "link").unlink()
    out.write_bytes(b"previous bundle")
    (tools / "work.py").unlink()
    # The same atomic write under another refusal, in-process (the CLI's error line is checked above).
    with pytest.raises(HeddleError, match="ServerTool 'work' has no executable") as caught:
        seal_in_process(flow, tools_dir=tools, sign_key=keypair.signing, output=out)
    assert caught.value.exit_code == 2
    assert out.read_bytes() == b"previous bundle"
    assert sorted(p.name for p in sandbox.iterdir() if p.name.startswith("app")) == ["app.heddle"]


def test_packing_twice_gives_the_same_bytes_and_digest(sandbox, keypair):
    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    outs = []
    for i, umask in enumerate((0o022, 0o077)):
        os.utime(flow, (1000 + i, 1000 + i))
        old = os.umask(umask)
        try:
            out = sandbox / f"app{i}.heddle"
            seal_in_process(flow, tools_dir=tools, sign_key=keypair.key_path, output=out)
        finally:
            os.umask(old)
        outs.append(out.read_bytes())
    # Each signature seals the time it was made, in the signatures entry alone: everything else,
    # the manifest (so the digest) and every payload byte, is the same.
    import zstandard

    from heddle.format.verify import peek

    tars = [zstandard.ZstdDecompressor().decompress(blob) for blob in outs]
    heads = [peek(sandbox / f"app{i}.heddle") for i in range(2)]
    assert heads[0].manifest_bytes == heads[1].manifest_bytes
    assert [s.keyid for s in heads[0].signatures.signatures] == [s.keyid for s in heads[1].signatures.signatures]
    masked = [tar.replace(head.signatures.to_bytes(), b"\0" * len(head.signatures.to_bytes()))
              for tar, head in zip(tars, heads, strict=True)]
    assert masked[0] == masked[1] and masked[0] != tars[0]


def test_untrusted_and_tampered_bundles_never_run(sandbox, keypair, capsys):
    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    write_tool(tools, "work.py", f"open({str(sandbox / 'RAN')!r}, 'w').close()\nout = {{'notes': '', 'lines': []}}")
    out = sandbox / "app.heddle"
    seal_in_process(flow, tools_dir=tools, sign_key=keypair.signing, output=out)
    proc = heddle("run", out, "--input", '{"text": "x"}')
    assert proc.returncode == 4 and keypair.public.keyid in error_line(proc)
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0x01
    tampered = sandbox / "tampered.heddle"
    tampered.write_bytes(bytes(data))
    # Refused when opened, before anything runs (the command's refusal of a tampered bundle is
    # tests/bundle/test_mutations.py::test_the_cli_refuses_a_mutant_in_one_line).
    import heddle as library

    with pytest.raises(HeddleError) as caught:
        library.open_bundle(tampered, trust=library.TrustPolicy.keys(keypair.pub_path))
    assert caught.value.exit_code in (6, 7), caught.value
    assert not (sandbox / "RAN").exists()
    assert state_of(heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"text": "x"}')) \
        is not None
    assert (sandbox / "RAN").exists()


def test_an_unsigned_bundle_runs_only_with_allow_unsigned(sandbox, capsys):
    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    out = sandbox / "app.heddle"
    # Sealing unsigned through the command is setup here (`heddle bundle`'s process: the tests above).
    proc = heddle_here(capsys, "bundle", flow, "-t", tools, "--mount", src / "notes", "--mount",
                       f"{src / 'data'}:data:rw", "-o", out)
    assert proc.returncode == 0 and "unsigned" in proc.stdout
    proc = heddle_here(capsys, "run", out, "--input", '{"text": "x"}')
    assert proc.returncode == 3
    assert state_of(heddle_here(capsys, "run", out, "--allow-unsigned", "--input", '{"text": "x"}'))["lines"] == [
        "seed", "x"]


def test_recorded_tool_round_proposal_and_command_line_override(sandbox, keypair, capsys):
    from tests.support.threaded_model import threaded_model

    src = sandbox / "src"
    src.mkdir()
    write_tool(src / "tools", "echo.py", "out = args")
    calls = [{"tool_calls": [{"name": "echo", "arguments": {"m": str(i)}}]} for i in range(3)]
    with threaded_model([*calls, {"content": "done"}, *calls, {"content": "done"}]) as model:
        f = FlowDoc("rounds")
        s = f.start(["query"])
        a = f.agent("agent", model.url, tools=[server_tool("echo", ["m"])])
        e = f.end(["result"])
        f.control(s, a)
        f.control(a, e)
        flow = f.write(src / "flow.json")
        out = sandbox / "app.heddle"
        seal_in_process(flow, tools_dir=src / "tools", max_tool_rounds=2, sign_key=keypair.signing, output=out)
        proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"query": "q"}')
        assert proc.returncode == 1 and "--max-tool-rounds 2" in error_line(proc)
        proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"query": "q"}',
                           "--max-tool-rounds", "5")
        assert state_of(proc)["result"] == "done"


def test_a_format_1_bundle_runs_only_with_allow_unsigned(sandbox, capsys):
    legacy = VECTORS / "legacy-gzip.heddle"
    proc = heddle_here(capsys, "run", legacy)
    assert proc.returncode == 3
    # With --allow-unsigned it runs (through the command in
    # tests/bundle/test_cache_anchor.py::test_a_cached_format_1_bundle_is_not_unpacked_again).
    import heddle as library

    with library.open_bundle(legacy, trust=library.TrustPolicy.allow_unsigned()) as bundle:
        assert library.run(bundle).state == {"text": "hi", "echoed": "hi"}
