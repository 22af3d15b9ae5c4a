"""Suite-wide settings."""

from __future__ import annotations

import os
from pathlib import Path

# The shared conformance corpus lives beside the checkout (../shared/conformance); the tests that
# read it run when it is there, as scripts/test runs the corpus itself only when it is there.
CONFORMANCE = Path(os.environ.get("HEDDLE_CONFORMANCE_DIR")
                   or Path(__file__).resolve().parents[2] / "shared" / "conformance")
collect_ignore = [] if (CONFORMANCE / "run.py").exists() else ["model/test_conformance.py"]
