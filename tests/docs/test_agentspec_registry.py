"""Every concrete component type the newest pyagentspec knows is in heddle's catalogue: run, or
refused by name with its reason. A release that adds a type fails this test the day it is tested,
instead of heddle calling a document's component merely "unknown".

pyagentspec is never a dependency: the package index is asked for its newest release, which is
installed into a scratch virtualenv as the pyagentspec validity test installs its own
(tests/examples/test_pyagentspec_valid.py; the same one while the newest is the version it pins),
and its registry is read there by a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from heddle.agentspec import catalog
from tests.examples.test_pyagentspec_valid import _pyagentspec_python

# The registry names the abstract bases too (Node, Tool, LlmConfig's own parents...): a document
# can only name a concrete type.
REGISTRY = r"""
import json
import pyagentspec
from pyagentspec._component_registry import BUILTIN_CLASS_MAP
concrete = sorted(name for name, cls in BUILTIN_CLASS_MAP.items() if not getattr(cls, "_is_abstract", False))
print(json.dumps({"version": getattr(pyagentspec, "__version__", "?"), "types": concrete}))
"""


def unplaced(types: list[str]) -> list[str]:
    """The types heddle neither runs nor refuses with a reason."""
    return sorted(t for t in types if t not in catalog.BY_TYPE
                  or (catalog.status(t) != "runs" and catalog.refusal(t) is None))


def test_a_type_the_catalogue_does_not_place_is_found() -> None:
    assert unplaced(["Flow", "GeminiVertexAIAuthConfig", "TelepathyNode"]) == ["TelepathyNode"]


def newest_release() -> str:
    """The newest pyagentspec on the package index; skips the test with pip's words when it cannot say."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "pyagentspec",
                               "--disable-pip-version-check", "--retries", "0", "--timeout", "15"],
                              check=False, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip("the package index did not say which pyagentspec is the newest within 60 s")
    found = re.match(r"pyagentspec \(([^)\s]+)\)", proc.stdout)
    if found is None:
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        pytest.skip(f"the package index did not say which pyagentspec is the newest: {said[-1] if said else '?'}")
    return found.group(1)


def test_every_type_of_the_newest_pyagentspec_is_run_or_refused_by_name() -> None:
    python = _pyagentspec_python(newest_release())
    proc = subprocess.run([str(python), "-c", REGISTRY], check=False, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert len(found["types"]) >= 61, found  # 26.3.1's concrete types: the registry was read
    missing = unplaced(found["types"])
    assert missing == [], (
        f"pyagentspec {found['version']} defines component types heddle's catalogue does not place: "
        f"{', '.join(missing)}; add each to heddle/agentspec/catalog.py (run it, or refuse it with why and what would "
        "run it) and update docs/agentspec.md's table")
