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
# their own in a folder outside the tree (never a new __pycache__ beside the sources: tests list
# and seal folders of the checkout). The programs the suite starts still write none.
if sys.dont_write_bytecode:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        import compileall

        compileall.compile_dir(Path(__file__).resolve().parents[1] / "heddle", quiet=1)
    sys.pycache_prefix = os.path.join(tempfile.gettempdir(), f"heddle-tests-bytecode-{os.getuid()}")
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


@pytest.fixture(scope="session", autouse=True)
def _private_data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The default session store (sqlite under $XDG_DATA_HOME/heddle) of every run this suite makes,
    in this process or a `heddle` it starts, lives in a folder of this test session: never the
    user's own."""
    home = tmp_path_factory.mktemp("xdg-data")
    before = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = before


# tests/model/test_conformance.py skips itself, with the reason, when the shared corpus is absent:
# a test that silently vanishes from the report looks like a test that passed.
