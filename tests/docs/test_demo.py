"""`scripts/demo` runs as a new user runs it, and ends by saying where `heddle` is and how to put it on PATH
(the README's next commands call it by name)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_ends_by_saying_how_to_put_heddle_on_path(tmp_path: Path) -> None:
    # A checkout of its own (the demo writes .heddle-demo beside scripts/), sharing this virtualenv and package.
    root = tmp_path / "checkout"
    (root / "examples").mkdir(parents=True)
    shutil.copytree(REPO / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "examples" / "skills-agent", root / "examples" / "skills-agent")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / ".venv").mkdir()
    (root / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    (root / ".venv" / ".heddle-installed-compat").touch()  # newer than pyproject.toml: the demo installs nothing
    (root / "heddle").symlink_to(REPO / "heddle")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEDDLE_", "OPENAI_", "XDG_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"),
               XDG_DATA_HOME=str(home / "data"), PATH="/usr/bin:/bin")
    proc = subprocess.run(["bash", str(root / "scripts" / "demo")], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    tail = proc.stderr.rstrip().splitlines()[-3:]
    assert tail == [(f"==> heddle is in .venv/bin; to call it by name, as the README does next, run one of these "
                     f"in {root}:"),
                    '   export PATH="$PWD/.venv/bin:$PATH"',
                    "   source .venv/bin/activate"], proc.stderr
    shutil.rmtree(root / ".heddle-demo", ignore_errors=True)
