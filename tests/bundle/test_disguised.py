"""A file is a bundle or it is refused: names, bundle-only options, FIFOs, folders, devices, and
documents that nest deeply enough to blow the parser's stack.

Where a user meets a refusal it is checked through the real `heddle` (one call per kind of
refusal, as processes are slow); the rest of the rule, which every command shares, in-process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from heddle import canonical
from heddle.cli.target import resolve_flow, resolve_target
from heddle.errors import DocumentError, UsageError
from heddle.format.errors import BundleError, MalformedBundleError
from heddle.format.signing import PAYLOAD_TYPE
from tests.bundle.conftest import load_make_vectors, write_agent
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here

TIMEOUT = 20  # a FIFO that blocked would hang the command: fail rather than wait a minute


def refused(proc, code: int, *needles: str) -> str:
    """The one error line of a refusal with exit `code`; no traceback, nothing on stdout."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [error_line(proc)], proc.stderr
    assert proc.stdout == ""
    line = error_line(proc)
    for needle in needles:
        assert needle in line, line
    return line


def test_a_flow_named_heddle_or_given_with_trust_is_refused_not_run(sandbox, keypair, capsys):
    paths = write_agent(sandbox / "agent")
    flow, tools = paths["flow"], paths["tools"]
    disguised = sandbox / "app.heddle"
    disguised.write_bytes(flow.read_bytes())
    # Before, this ran the flow unverified, with this machine's keys.
    refused(heddle("run", disguised, "--input", '{"text": "x"}', timeout=TIMEOUT), 7,
            f"{disguised}: not a heddle bundle", "--flow PATH")
    # The refusal above through the process; the same rule's other answers in-process.
    line = refused(heddle_here(capsys, "run", flow, "-t", tools, "--trust", keypair.pub_path), 7,
                   f"{flow}: not a heddle bundle")
    assert "apply to bundles" in line
    other = sandbox / "agent.txt"
    other.write_bytes(flow.read_bytes())
    refused(heddle_here(capsys, "run", other, "-t", tools), 2, f"{other}:", "--flow PATH", ".json, .yaml or .yml")
    state = state_of(heddle_here(capsys, "run", "--flow", other, "-t", tools, "--input", '{"text": "hi"}'))
    assert state["echoed"] == "hi"
    refused(heddle_here(capsys, "bundle", disguised, "-t", tools), 2, "seals a flow document")


def test_the_rule_every_command_shares(sandbox, keypair):
    paths = write_agent(sandbox / "agent")
    flow = paths["flow"]
    disguised, other, renamed = sandbox / "app.heddle", sandbox / "agent.txt", sandbox / "real.json"
    disguised.write_bytes(flow.read_bytes())
    other.write_bytes(flow.read_bytes())
    renamed.write_bytes(load_make_vectors().archive(load_make_vectors().signed()[2]))
    assert resolve_target(flow, None).is_bundle is False
    assert resolve_target(None, other).is_bundle is False
    assert resolve_target(None, disguised).is_bundle is False  # --flow reads any file as a flow
    # A file that starts like a bundle is opened as one whatever its name: that only adds the proof.
    assert resolve_target(renamed, None).is_bundle is True
    assert resolve_target(renamed, None, bundle_options=["--trust"]).is_bundle is True
    for option in ("--trust", "--allow-unsigned", "--data-dir"):
        with pytest.raises(MalformedBundleError, match="apply to bundles only"):
            resolve_target(flow, None, bundle_options=[option])
    with pytest.raises(MalformedBundleError, match=r"app\.heddle: not a heddle bundle \(it does not start"):
        resolve_target(disguised, None)
    with pytest.raises(UsageError, match="not both"):
        resolve_target(other, other)
    with pytest.raises(UsageError, match="--flow PATH"):
        resolve_target(None, None)
    with pytest.raises(UsageError, match="apply to bundles"):
        resolve_target(None, other, bundle_options=["--trust"])
    with pytest.raises(UsageError, match="no such file"):
        resolve_target(sandbox / "missing.heddle", None)
    # `heddle bundle` seals a flow by the same rule, and never a bundle.
    assert resolve_flow(flow, None) == flow and resolve_flow(None, other) == other
    for path, message in ((renamed, "is a heddle bundle"), (disguised, "named like a heddle bundle"),
                          (other, "--flow PATH")):
        with pytest.raises(UsageError, match=message):
            resolve_flow(path, None)


def test_a_fifo_a_folder_or_a_device_is_refused_without_blocking(sandbox, capsys):
    from heddle.format.verify import peek
    from heddle.agentspec import load_flow

    pipe_bundle, pipe_flow = sandbox / "pipe.heddle", sandbox / "pipe.yaml"
    os.mkfifo(pipe_bundle)
    os.mkfifo(pipe_flow)
    folder = sandbox / "folder.heddle"
    folder.mkdir()
    refused(heddle("verify", pipe_bundle, timeout=TIMEOUT), 7, f"{pipe_bundle}: not a heddle bundle (it is a FIFO)")
    # In-process after the first: each refuses before any open of the FIFO (load_flow and peek, below).
    refused(heddle_here(capsys, "run", pipe_bundle), 7, f"{pipe_bundle}: not a heddle bundle (it is a FIFO)")
    refused(heddle_here(capsys, "run", pipe_flow), 2, f"{pipe_flow}: is a FIFO, not a regular file")
    # The rest of the same rule, in-process: the verifier's one open and the flow reader.
    for path, kind in ((pipe_bundle, "a FIFO"), (folder, "a directory"), (Path(os.devnull), "a character device")):
        with pytest.raises(MalformedBundleError, match=f"not a heddle bundle \\(it is {kind}\\)"):
            peek(path)
        with pytest.raises(MalformedBundleError, match=f"it is {kind}"):
            resolve_target(path, None, bundle_options=["--trust"])
    # What `heddle run folder.heddle` gives (the command's path for a bundle that is no file: the FIFO above).
    with pytest.raises(MalformedBundleError,
                       match=r"folder\.heddle: not a heddle bundle \(it is a directory\)") as caught:
        resolve_target(folder, None)
    assert caught.value.exit_code == 7
    for path in (pipe_flow, pipe_bundle, Path(os.devnull)):
        with pytest.raises(DocumentError, match="not a regular file"):
            load_flow(path)
    with pytest.raises(UsageError, match="is a character device"):
        resolve_target(Path(os.devnull), None)


def _crafted(manifest: bytes | None = None, signatures: bytes | None = None, flow: bytes | None = None) -> bytes:
    """The vectors' unsigned bundle with one of its documents replaced as given."""
    vectors = load_make_vectors()
    files = list(vectors.BASE_FILES)
    if flow is not None:
        files = [(p, flow if p == "flow.json" else d, m) for p, d, m in files]
    if manifest is None:
        manifest = canonical.dumps(vectors.manifest_obj(files))
    if signatures is None:
        signatures = canonical.dumps({"payloadType": PAYLOAD_TYPE, "signatures": []})
    return vectors.archive(vectors.entries(manifest, signatures, files))


DEEP = b"[" * 20_000 + b"]" * 20_000
NEEDLE = "nests deeper than 64 levels"


def test_a_deeply_nested_signatures_file_is_malformed_before_trust(sandbox, capsys):
    bundle = sandbox / "deep-signatures.heddle"
    bundle.write_bytes(_crafted(signatures=b'{"payloadType":"%s","signatures":%s}' % (PAYLOAD_TYPE.encode(), DEEP)))
    assert bundle.stat().st_size < 2048
    refused(heddle("run", bundle, timeout=TIMEOUT), 7, f"{bundle} signatures {NEEDLE}")
    refused(heddle_here(capsys, "inspect", bundle), 7, f"{bundle} signatures {NEEDLE}")  # the same peek
    # `heddle verify` reads it with the same one peek (its refusal of a malformed bundle through
    # the command: test_a_fifo_a_folder_or_a_device_is_refused_without_blocking).
    from heddle.format.verify import peek

    with pytest.raises(MalformedBundleError, match=f"signatures {NEEDLE}"):
        peek(bundle)


def test_a_deeply_nested_manifest_or_flow_is_malformed(sandbox, capsys):
    from heddle.bundle.fingerprints import flow_tool_fingerprints
    from heddle.format.verify import verify_bundle, peek

    manifest = sandbox / "deep-manifest.heddle"
    manifest.write_bytes(_crafted(manifest=DEEP))
    refused(heddle("doctor", manifest, timeout=TIMEOUT), 7, f"{manifest} manifest {NEEDLE}")
    proc = heddle_here(capsys, "verify", "--json", "--allow-unsigned", manifest)  # the same peek, in-process
    assert proc.returncode == 7 and "Traceback" not in proc.stderr, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["kind"] == "over_cap" and NEEDLE in error["message"]
    flow = sandbox / "deep-flow.heddle"
    flow.write_bytes(_crafted(flow=b'{"component_type": "Flow", "metadata": ' + DEEP + b"}"))
    refused(heddle("run", flow, "--allow-unsigned", timeout=TIMEOUT), 7, "the sealed flow does not load", NEEDLE)
    with pytest.raises(MalformedBundleError, match=NEEDLE):
        peek(manifest)
    with pytest.raises(BundleError, match=NEEDLE):
        verify_bundle(flow, trusted_keys=[], allow_unsigned=True, cache_root=sandbox / "cache",
                    tool_fingerprints=flow_tool_fingerprints)
    # Nothing of either reached the cache.
    assert [p.name for p in (sandbox / "cache").iterdir() if not p.name.startswith(".")] == []
