"""The public API: the example in docs/library.md runs as written, the façade stays cheap to import,
trust is one value handed down whole, and the server never reaches into the CLI."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

import heddle
from tests.support.cli import env_with

REPO = Path(__file__).resolve().parents[1]
VECTORS = REPO / "bundle-format" / "vectors"


def _python(code: str, *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=cwd,
                          env=env_with(env), timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A trust store, cache and HOME of this test's own, here and in the processes it starts."""
    env = {}
    for name, var in (("trust", "HEDDLE_TRUST_DIR"), ("cache", "HEDDLE_CACHE_DIR"), ("home", "HOME")):
        (tmp_path / name).mkdir(mode=0o700)
        env[var] = str(tmp_path / name)
        monkeypatch.setenv(var, env[var])
    monkeypatch.delenv("HEDDLE_KEY_PASSPHRASE", raising=False)
    return env


def test_the_example_in_docs_library_runs_as_written(tmp_path: Path, private: dict[str, str]) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / "library.md").read_text(), re.DOTALL | re.MULTILINE)
    assert len(blocks) == 1, "docs/library.md shows the API in one example"
    work = tmp_path / "scratch"
    work.mkdir()
    proc = _python(blocks[0], cwd=work, env=private)
    assert proc.returncode == 0, proc.stderr
    assert "'loud': 'HI!'" in proc.stdout
    # The session part: the run stopped at the InputMessageNode, and the answer finished it.
    assert "{'kind': 'message', 'node': 'ask', 'prompt': 'What shall I shout?'}" in proc.stdout
    assert "{'loud': 'HELLO!'}" in proc.stdout
    assert sorted(p.name for p in work.iterdir()) == ["asking.json", "flow.json", "me.key", "me.pub", "sessions.db",
                                                      "shouter.heddle", "tools"]


def test_import_heddle_loads_no_heavy_library_and_exports_what_it_lists(tmp_path: Path) -> None:
    proc = _python("import sys, heddle, heddle.cli\n"
                   "print(sorted(m for m in ('pydantic', 'httpx', 'jsonschema', 'yaml', 'zstandard', 'cryptography',"
                   " 'asyncio', 'starlette') if m in sys.modules))", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    missing = [name for name in heddle.__all__ if not hasattr(heddle, name)]
    assert not missing
    assert issubclass(heddle.Warning, heddle.Event) and "Warning" not in heddle.__all__


def test_the_facade_resolves_its_names_when_used(tmp_path: Path) -> None:
    proc = _python("import sys, heddle\n"
                   "assert {'seal', 'TrustPolicy', 'run', 'Warning'} <= set(dir(heddle))\n"
                   "assert 'heddle.format.trust' not in sys.modules\n"
                   "from heddle.format.trust import TrustPolicy\n"
                   "from heddle.bundle.seal import seal\n"
                   "assert heddle.TrustPolicy is TrustPolicy and heddle.seal is seal\n"
                   "try:\n    heddle.no_such_name\nexcept AttributeError as exc:\n    print(exc)\n", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "module 'heddle' has no attribute 'no_such_name'"
    assert set(heddle.__all__) <= set(dir(heddle))


def test_the_server_never_imports_the_cli(tmp_path: Path) -> None:
    proc = _python("import pkgutil, importlib, sys, heddle.server\n"
                   "for m in pkgutil.iter_modules(heddle.server.__path__):\n"
                   "    if m.name != '__main__':  # that one starts a server\n"
                   "        importlib.import_module('heddle.server.' + m.name)\n"
                   "print(sorted(m for m in sys.modules if m == 'heddle.cli' or m.startswith('heddle.cli.')))",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_trust_is_one_value_and_refusals_carry_their_exit_codes(tmp_path: Path, private: dict[str, str]) -> None:
    from heddle.format.keys import generate

    with pytest.raises(heddle.UsageError, match=r"TrustPolicy.keys\(\) names no key"):
        heddle.TrustPolicy.keys()
    with pytest.raises(heddle.UsageError, match=r"give a heddle\.TrustPolicy"):
        heddle.open_bundle(VECTORS / "valid-signed.heddle", trust=[VECTORS / "x.pub"])  # type: ignore[arg-type]
    with pytest.raises(heddle.HeddleError, match="neither a public key file nor a key id"):
        heddle.TrustPolicy.from_names(["deadbeefcafe"])
    other = generate(tmp_path / "other", None)
    policy = heddle.TrustPolicy.keys(other.public_path, other.public_path)
    assert policy.keyids == [other.keyid] and not policy.admits_unsigned
    for trust, code in ((policy, 4), (heddle.TrustPolicy.store(), 4), (heddle.TrustPolicy.allow_unsigned(), 4)):
        with pytest.raises(heddle.UntrustedSignerError) as caught:
            heddle.open_bundle(VECTORS / "valid-signed.heddle", trust=trust, seed_data=False)
        assert caught.value.exit_code == code
    # An empty store admits nothing signed; the keys named pin trust to exactly them.
    assert heddle.TrustPolicy.store().trusted == ()
    assert heddle.TrustPolicy.from_names([other.public_path], allow_unsigned=True).admits_unsigned


def test_run_refuses_what_it_cannot_run_exactly(tmp_path: Path) -> None:
    bundle_named = tmp_path / "app.heddle"
    bundle_named.write_bytes(b"")
    with pytest.raises(heddle.UsageError, match=r"is a bundle; open it with heddle\.open_bundle"):
        heddle.run(bundle_named)
    with pytest.raises(heddle.UsageError, match=r"give a heddle\.Bundle"):
        heddle.run(42)  # type: ignore[arg-type]
    with pytest.raises(heddle.UsageError, match=r"give a heddle\.RunSettings"):
        heddle.run(tmp_path / "flow.json", settings={"timeout": 1})  # type: ignore[arg-type]

    async def inside_a_loop() -> None:
        heddle.run(tmp_path / "flow.json")

    with pytest.raises(heddle.UsageError, match=r"await heddle\.arun"):
        asyncio.run(inside_a_loop())
