"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Tools run from this process (in-process runs) or from a `heddle` it starts are written as
# `#!/usr/bin/env python3`: they should find the interpreter the suite runs on first, as
# tests/support/cli.py arranges for subprocesses, not a version manager's shim (a shell and a
# dozen processes per tool call).
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

# tests/model/test_conformance.py skips itself, with the reason, when the shared corpus is absent:
# a test that silently vanishes from the report looks like a test that passed.
