"""The exit status table of docs/cli.md is the error classes' own: every error heddle raises is in
the row of its exit status, and every class the table names has that status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Every module of heddle imported, then every HeddleError subclass with its status (in a process of its own:
# importing them all must not change what this one has loaded).
_LIST = """
import importlib, json, pkgutil, heddle
from heddle.cli.errors import WAITING_EXIT
from heddle.errors import HeddleError
for m in pkgutil.walk_packages(heddle.__path__, "heddle."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
def walk(c):
    for s in c.__subclasses__():
        yield s
        yield from walk(s)
# A class that names no kind of its own is a base, never raised (BundleError).
found = {c.__name__: c.exit_code for c in walk(HeddleError) if c.kind != HeddleError.kind}
print(json.dumps({**found, "WAITING_EXIT": WAITING_EXIT}))
"""


def _table() -> dict[int, set[str]]:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    rows: dict[int, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            assert int(cells[0]) not in rows, f"status {cells[0]} is listed twice"
            rows[int(cells[0])] = set(re.findall(r"`(\w+)`", cells[2]))
    return rows


def test_the_exit_status_table_is_the_error_classes() -> None:
    proc = subprocess.run([sys.executable, "-c", _LIST], capture_output=True, text=True, timeout=120, cwd=REPO,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    classes: dict[str, int] = json.loads(proc.stdout)
    table = _table()
    assert set(table) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 130}
    listed = {name: status for status, names in table.items() for name in names}
    assert sum(len(names) for names in table.values()) == len(listed), "a class is listed under two statuses"
    assert listed == classes


def test_the_readme_links_the_table() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "(docs/cli.md#exit-status)" in readme
