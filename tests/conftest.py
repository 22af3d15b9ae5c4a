"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
