"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Where PYTHONDONTWRITEBYTECODE is set (some shells and sandboxes set it), nothing kept bytecode:
# every pytest process compiled every module it imports and rewrote every test module's asserts
# again (~5 s of CPU for each xdist worker), and each of the ~150 `heddle` and `heddle-server`
# processes the suite starts compiled every module of heddle changed since its bytecode was last
# written (up to ~0.25 s a process). So heddle's bytecode is brought up to date once, where Python
# keeps it by default (compileall passes over what is current), and the pytest processes keep
# their own in pytest's cache folder of the checkout (never a new __pycache__ beside the sources:
# tests list and seal folders of the checkout; never the temporary folder, which the suite leaves
# as it found it). The programs the suite starts still write none.
if sys.dont_write_bytecode:
    _repo = Path(__file__).resolve().parents[1]
    if "PYTEST_XDIST_WORKER" not in os.environ:
        import compileall

        compileall.compile_dir(_repo / "heddle", quiet=1)
    sys.pycache_prefix = str(_repo / ".pytest_cache" / f"bytecode-{os.getuid()}")
    sys.dont_write_bytecode = False

# A throwaway Postgres cluster (session scope) for the session stores and the servers sharing one.
from tests.support.postgres import postgres_dsn  # noqa: F401

# Tools run from this process (in-process runs) or from a `heddle` it starts are written as
# `#!/usr/bin/env python3`: they should find the interpreter the suite runs on first, as
# tests/support/cli.py arranges for subprocesses, not a version manager's shim (a shell and a
# dozen processes per tool call).
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


# Where heddle keeps things of its own when nothing names a folder (XDG_CACHE_HOME: the cache of
# verified payloads; XDG_CONFIG_HOME: the trust store and other settings; XDG_DATA_HOME: the default
# session store) and the temporary folder (TMPDIR: seeded data folders, workspaces, a run killed
# on purpose leaves its own behind). The names every test session points at folders of its own.
PRIVATE_HOMES = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR")


@pytest.fixture(scope="session", autouse=True)
def _private_homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every run this suite makes, in this process or in a `heddle` or `heddle-server` it starts (they
    inherit this environment), keeps its cache, settings, sessions and temporary folders in folders
    of this test session: never the user's own, and nothing left in the temporary folder."""
    homes = {name: tmp_path_factory.mktemp(name.lower()) for name in PRIVATE_HOMES}
    before = {name: os.environ.get(name) for name in PRIVATE_HOMES}
    tempdir = tempfile.tempdir
    os.environ.update({name: str(path) for name, path in homes.items()})
    tempfile.tempdir = str(homes["TMPDIR"])  # this process's own, read once and kept
    yield homes
    tempfile.tempdir = tempdir
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# tests/model/test_conformance.py skips itself, with the reason, when the shared corpus is absent:
# a test that silently vanishes from the report looks like a test that passed.
