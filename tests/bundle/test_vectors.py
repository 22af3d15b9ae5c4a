"""Every committed vector through the verifier: its outcome, its exit code, its message,
and that nothing was written anywhere but the cache, and nothing at all on failure."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from heddle.format import signing
from heddle.format.errors import BundleError
from heddle.bundle.fingerprints import flow_tool_fingerprints
from heddle.format.verify import verify_bundle, peek

from .conftest import EXPECTED, VECTORS, load_make_vectors, snapshot, vector_keys

KEYS = vector_keys()
CASES = EXPECTED["cases"]


def _open(case: dict, cache: Path):
    return verify_bundle(
        VECTORS / case["file"],
        trusted_keys=[KEYS[name] for name in case["trust"]],
        allow_unsigned=case["allow_unsigned"],
        cache_root=cache,
        tool_fingerprints=flow_tool_fingerprints,
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_vector(case: dict, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    vectors_before = snapshot(VECTORS)
    expect = case["expect"]
    if expect["outcome"] == "ok":
        opened = _open(case, cache)
        assert opened.legacy == expect.get("legacy", False)
        if not opened.legacy:
            assert opened.signers == expect["signers"]
        _assert_sealed_tree(opened)
        # Only the sealed tree is in the cache; no staging folder is left behind.
        assert sorted(os.listdir(cache)) == [opened.root.parent.name]
        again = _open(case, cache)
        assert again.cached and again.root == opened.root
    else:
        with pytest.raises(BundleError) as caught:
            _open(case, cache)
        err = caught.value
        assert (err.kind, err.exit_code) == (expect["outcome"], expect["exit_code"]), err.message
        assert expect["message"] in err.message
        assert "\n" not in err.message
        # Nothing was written: the cache folder holds nothing (not even a staging folder),
        # and nothing appeared beside it, wherever an entry's name pointed.
        assert not cache.exists() or os.listdir(cache) == []
        assert set(snapshot(tmp_path)) <= {"cache"}
    assert snapshot(VECTORS) == vectors_before


def _assert_sealed_tree(opened) -> None:
    seen = {}
    for top, dirs, files in os.walk(opened.root):
        assert stat.S_IMODE(os.stat(top).st_mode) == 0o555
        for name in files:
            path = Path(top) / name
            st = os.lstat(path)
            assert stat.S_ISREG(st.st_mode)
            seen[path.relative_to(opened.root).as_posix()] = (path.read_bytes(), stat.S_IMODE(st.st_mode))
    manifest = opened.manifest
    assert set(seen) == {f.path for f in manifest.files}
    for item in manifest.files:
        data, mode = seen[item.path]
        assert hashlib.sha256(data).hexdigest() == item.sha256
        assert mode == (0o555 if item.executable else 0o444)
    assert opened.flow_path.is_file()


def test_every_outcome_and_required_attack_is_covered() -> None:
    names = {c["name"] for c in CASES}
    required = {
        "flipped-payload-byte", "flipped-manifest-byte", "stripped-signatures", "untrusted-signer",
        "duplicated-signature", "manifest-not-first", "unlisted-entry", "missing-entry", "reordered-entries",
        "duplicated-entry", "size-mismatch", "traversal-path", "traversal-entry", "absolute-path",
        "symlink-member", "hardlink-member", "symlink-chain", "char-device", "block-device", "fifo-member",
        "casefold-collision", "unicode-collision", "windows-reserved-name", "decompression-bomb",
        "second-zstd-frame", "trailing-junk", "truncated", "newer-format-version",
    }
    assert required <= names
    assert {c["expect"]["exit_code"] for c in CASES} == {0, 3, 4, 5, 6, 7, 8}


def test_vectors_are_small() -> None:
    for path in VECTORS.glob("*.heddle"):
        assert path.stat().st_size < 16 * 1024, path.name


# Runs make_vectors.py with every import of heddle refused, so the vectors cannot lean on the
# code they test (an editable install makes heddle importable from any interpreter of the venv).
_WITHOUT_HEDDLE = """
import importlib.abc, runpy, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "heddle":
            raise ImportError("make_vectors.py must not import heddle: " + name)
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_script_imports_nothing_of_heddle() -> None:
    tree = ast.parse((VECTORS / "make_vectors.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and not [name for name in imported if name.split(".")[0] == "heddle"]


def test_committed_vectors_are_what_the_script_makes(tmp_path: Path) -> None:
    script = VECTORS / "make_vectors.py"
    done = subprocess.run([sys.executable, "-I", "-c", _WITHOUT_HEDDLE, str(script), "--out", str(tmp_path)],
                          check=False, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    made = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_bytes() for p in VECTORS.iterdir() if p.name != "make_vectors.py"}
    assert made.keys() == committed.keys()
    for name, data in made.items():
        assert data == committed[name], f"{name} differs: run bundle-format/vectors/make_vectors.py"


def test_the_specs_pae_example_is_what_both_implementations_make() -> None:
    # The prose may wrap anywhere; the literals are taken exactly as written.
    prose = r"manifest\s+bytes\s+`([^`\n]*)`\s+would\s+be\s+signed\s+as\s+the\s+(\d+)\s+bytes\s+`([^`\n]*)`"
    found = re.search(prose, (VECTORS.parent / "SPEC.md").read_text(encoding="utf-8"))
    assert found, "SPEC.md section 6 no longer shows the PAE example this test reads"
    body, length, literal = found[1].encode(), int(found[2]), found[3].encode()
    assert len(literal) == length
    assert signing.pae(signing.PAYLOAD_TYPE, body) == literal
    vectors = load_make_vectors()
    assert vectors.PAYLOAD_TYPE == signing.PAYLOAD_TYPE
    assert vectors.pae(vectors.PAYLOAD_TYPE, body) == literal


def test_manifest_schema_matches_the_reader() -> None:
    """Valid manifests pass manifest.schema.json; the reader's refusals of shape fail it too."""
    import jsonschema

    schema = json.loads((VECTORS.parent / "manifest.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for case in CASES:
        if case["expect"]["outcome"] == "ok" and not case["expect"].get("legacy"):
            validator.validate(peek(VECTORS / case["file"]).manifest.to_json())
    good = peek(VECTORS / "valid-signed.heddle").manifest.to_json()
    bad_shapes = [
        {**good, "surprise": True},
        {**good, "version": 2},
        {**good, "files": [{**good["files"][0], "mode": 511}]},
        {**good, "files": [{**good["files"][0], "path": "../x"}]},
        {**good, "files": [{**good["files"][0], "extra": 1}]},
        {**good, "mounts": [{"prefix": "mounts/x", "dest": "x", "mode": "rwx"}]},
        {**good, "proposals": {"max_tool_rounds": 0}},
        {**good, "requires": {"bins": [], "env": ["1BAD"], "files": []}},
        {k: v for k, v in good.items() if k != "input"},
    ]
    from heddle.format.errors import MalformedBundleError
    from heddle.format.manifest import Manifest

    for doc in bad_shapes:
        assert not validator.is_valid(doc), doc
        with pytest.raises(MalformedBundleError):
            Manifest.from_json(doc)
