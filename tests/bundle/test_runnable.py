"""A verified bundle runs exactly what was sealed: its flow, its tools, its mounts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heddle.bundle.verified import open_bundle
from heddle.format.errors import ContentMismatchError, UntrustedSignerError
from heddle.format.pack import pack
from heddle.format.trust import TrustPolicy, TrustStore

from .conftest import VECTORS, KeyPair, agent_plan, write_agent


def test_a_sealed_bundle_runs_its_own_tool(sandbox: Path, keypair: KeyPair) -> None:
    from heddle.engine import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.workspace.workspace import WorkspaceOptions

    paths = write_agent(sandbox / "agent")
    bundle = sandbox / "app.heddle"
    pack(agent_plan(paths, input={"text": "sealed hello"}), bundle, signing_key=keypair.signing)
    # The sources change after sealing; the run must not see it.
    (paths["tools"] / "echo.py").write_text("#!/bin/sh\necho '{\"echoed\": \"tampered\"}'\n")

    runnable = open_bundle(bundle, trust=TrustPolicy.keys(keypair.pub_path), data_dir=sandbox / "data")
    assert runnable.name == "flow" and runnable.signers == (keypair.signing.keyid,)
    root = runnable.flow_path.parent
    assert runnable.tools == {"echo": root / "tools" / "echo.py"}
    mounts = {str(m.dest): (m.source, m.mode) for m in runnable.mounts}
    assert mounts["notes"] == (root / "mounts/notes", "ro")
    assert mounts["work"] == (sandbox / "data" / "work", "rw")
    assert runnable.data_dir == sandbox / "data" and not runnable.data_dir_created

    options = RunOptions(workspace=WorkspaceOptions(mounts=tuple(runnable.mounts)))
    prepared = prepare_run(runnable.flow, tools=runnable.tools, tools_dir=runnable.tools_dir, options=options)
    state = asyncio.run(run_prepared(prepared, runnable.input)).state
    assert state["echoed"] == "sealed hello"


def test_runnable_uses_the_trust_store_and_checks_fingerprints(sandbox: Path) -> None:
    with pytest.raises(UntrustedSignerError):
        open_bundle(VECTORS / "valid-signed.heddle", trust=TrustPolicy.store())
    store = TrustStore()
    from .conftest import EXPECTED

    (sandbox / "vector.pub").write_text(EXPECTED["keys"]["trusted"]["public_pem"])
    store.add(sandbox / "vector.pub")
    runnable = open_bundle(VECTORS / "valid-signed.heddle", trust=TrustPolicy.store(), seed_data=False)
    assert sorted(runnable.tools) == ["echo"] and runnable.input == {"text": "hello"}
    assert [(m.dest, m.mode) for m in runnable.manifest.mounts] == [("notes", "ro"), ("work", "rw")]
    with pytest.raises(ContentMismatchError, match="fingerprint"):
        open_bundle(VECTORS / "tool-fingerprint-mismatch.heddle", trust=TrustPolicy.store(), seed_data=False)


def test_a_format_1_bundle_runs_from_its_tools_folder(sandbox: Path) -> None:
    runnable = open_bundle(VECTORS / "legacy-gzip.heddle", trust=TrustPolicy.allow_unsigned(),
                           data_dir=sandbox / "data")
    assert runnable.legacy
    assert runnable.flow_path == runnable.tools_dir.parent / "flow" / "flow.json"
    assert sorted(runnable.tools) == ["echo"]
    assert runnable.manifest.proposals.max_tool_rounds == 4
    assert [(str(m.dest), m.mode) for m in runnable.mounts] == [("notes", "ro")]
    assert (runnable.mounts[0].source / "readme.md").is_file()
