"""Shared pieces for bundle tests: the committed vectors, their keys, and a sandbox
in which the trust store, the cache and HOME are private to the test."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heddle.format.keys import PublicKey, SigningKey, generate, load_public_key, load_signing_key

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "bundle-format" / "vectors"
EXPECTED = json.loads((VECTORS / "expected.json").read_text(encoding="utf-8"))
CONFORMANCE = REPO.parent / "shared" / "conformance" / "cases"


def vector_keys() -> dict[str, PublicKey]:
    from cryptography.hazmat.primitives import serialization

    from heddle.format.keys import key_id

    keys = {}
    for name, record in EXPECTED["keys"].items():
        key = serialization.load_pem_public_key(record["public_pem"].encode())
        keys[name] = PublicKey(key_id(key), key, f"vector key {name}")
    return keys


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` (links not followed) with its type bits and size."""
    out: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_mode & 0o170000, st.st_size)
    return out


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private trust store, cache and HOME, for the library and for `heddle` subprocesses."""
    for name in ("trust", "cache", "home"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("HEDDLE_KEY_PASSPHRASE", raising=False)
    return tmp_path


@dataclass
class KeyPair:
    signing: SigningKey
    public: PublicKey
    key_path: Path
    pub_path: Path


def make_keypair(folder: Path, name: str) -> KeyPair:
    made = generate(folder / name, None)
    return KeyPair(load_signing_key(made.private_path), load_public_key(made.public_path),
                   made.private_path, made.public_path)


@pytest.fixture
def keypair(sandbox: Path) -> KeyPair:
    (sandbox / "keys").mkdir(exist_ok=True)
    return make_keypair(sandbox / "keys", "me")


def load_make_vectors() -> Any:
    """bundle-format/vectors/make_vectors.py as a module (it is a script, not a package)."""
    import importlib.util
    import sys

    if "make_vectors" in sys.modules:
        return sys.modules["make_vectors"]
    spec = importlib.util.spec_from_file_location("make_vectors", VECTORS / "make_vectors.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_vectors"] = module
    spec.loader.exec_module(module)
    return module


def write_agent(root: Path) -> dict[str, Any]:
    """A small agent on disk: a flow naming one tool, a tools folder, a notes folder with a .git
    folder (left out of a bundle), a work folder."""
    vectors = load_make_vectors()
    root.mkdir(parents=True, exist_ok=True)
    (root / "flow.json").write_bytes(vectors.FLOW)
    tools = root / "tools"
    tools.mkdir()
    (tools / "echo.py").write_bytes(vectors.ECHO)
    (tools / "echo.py").chmod(0o755)
    notes = root / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "readme.md").write_text("# notes\n")
    (notes / "sub" / "deep.txt").write_text("deep\n")
    (notes / ".git").mkdir()
    (notes / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    work = root / "work"
    work.mkdir()
    (work / "draft.txt").write_text("draft\n")
    return {"flow": root / "flow.json", "tools": tools, "notes": notes, "work": work}


def agent_plan(paths: dict[str, Any], **kw: Any):
    """The plan `heddle bundle` would make for the agent from `write_agent`."""
    from pathlib import PurePosixPath

    from heddle.bundle.fingerprints import flow_tool_fingerprints
    from heddle.bundle.plan import ToolSpec, make_plan
    from heddle.workspace.mounts import Mount

    fingerprints = flow_tool_fingerprints(paths["flow"])
    mounts = kw.pop("mounts", [
        Mount(paths["notes"], PurePosixPath("notes"), "ro"),
        Mount(paths["work"], PurePosixPath("work"), "rw"),
    ])
    return make_plan(
        paths["flow"], tools_dir=paths["tools"],
        tools={name: ToolSpec(paths["tools"] / f"{name}.py", fp) for name, fp in fingerprints.items()},
        mounts=mounts, **kw,
    )
