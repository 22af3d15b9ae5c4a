"""Finding tool executables: the name of a tool is its file name without the extension."""

from __future__ import annotations

import stat
from pathlib import Path

from heddle.errors import UsageError


def tool_name(path: Path) -> str:
    name = path.name
    return name.split(".", 1)[0] if not name.startswith(".") else name


def discover_tools(tools_dir: str | Path | None) -> dict[str, Path]:
    """Map tool name -> executable path for every regular file in `tools_dir` (not recursive).

    Two files with one name (`echo.py` and `echo.sh`) are ambiguous and refused, naming both.
    """
    if tools_dir is None:
        return {}
    root = Path(tools_dir)
    if not root.exists():
        # A flow that names no tools runs without the folder; one that does is refused by the
        # graph check, which names each missing tool.
        return {}
    if not root.is_dir():
        raise UsageError(f"--tools-dir {root}: is a file, not a directory of tool executables")
    found: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        try:
            st = entry.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        name = tool_name(entry)
        if name in found:
            raise UsageError(
                f"tools directory {root}: {found[name].name} and {entry.name} both define tool {name!r}; "
                "keep one"
            )
        found[name] = entry.resolve()
    return found
