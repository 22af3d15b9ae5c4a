"""docs/architecture.md names every module of heddle/: a module added without its row in the map is a
module a reader of the map cannot find (a package's `__init__.py` and `__main__.py` aside)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_map_names_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("|")]
    missing = []
    for path in sorted((ROOT / "heddle").rglob("*.py")):
        relative = path.relative_to(ROOT / "heddle").as_posix()
        package, _, name = relative.rpartition("/")
        if name in ("__init__.py", "__main__.py") or f"`{relative}`" in doc:
            continue
        # A row may name a package's modules after its first: `cli/output.py`, `report.py`, ...
        if package and any(f"`{package}/" in row and f"`{name}`" in row for row in rows):
            continue
        missing.append(relative)
    assert not missing, f"docs/architecture.md's map names none of {missing}: give each a row (what it is for)"
