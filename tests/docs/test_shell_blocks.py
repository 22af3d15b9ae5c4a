"""Every `sh` block of every README.md (examples/ included) and docs/*.md runs as written, top to bottom.

Each file's blocks run in order in one bash process (so `cd`, variables and background jobs carry
from one block to the next), under `set -euo pipefail`, in a scratch folder that holds a copy of
examples/ as a checkout does (a README's blocks start in its own folder there, a docs page's at the
top), with HOME, the XDG folders, the cache and the trust store inside it
and this virtualenv first on PATH. A block that cannot run there (a real vendor key, a checkout of
heddle) has a `<!-- needs: WHAT -->` line just above it and is reported as skipped, with the reason; output
that is not a command is fenced as `text` (every fence names its language, so none hides).
A file must stop every background job it starts.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _readmes() -> list[Path]:
    """Every README.md of the checkout, outside hidden folders (the virtualenv, caches) and installed packages."""
    found = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__")
                         and not d.endswith(".egg-info"))
        if "README.md" in files:
            found.append(Path(folder) / "README.md")
    return found


DOCS = [*_readmes(), *sorted((REPO / "docs").glob("*.md"))]
SHELL = frozenset({"sh", "bash", "shell"})
TIMEOUT = 120.0  # seconds for one file's blocks: a safety net (examples/plugins runs ten commands, a few seconds each)

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^`\s]*)")
_NEEDS = re.compile(r"^<!--\s*needs:\s*(.+?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    needs: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the `needs:` marker above each, if any."""
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, language, start = match.group(1), match.group(2), i
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        needs = _NEEDS.match(above)
        body: list[str] = []
        i += 1
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path.relative_to(REPO)}:{start + 1}: a fence that is never closed")
        out.append(Block(path, start + 1, language, "\n".join(body) + "\n", needs.group(1) if needs else None))
        i += 1
    return out


def _closes(line: str, fence: str) -> bool:
    """Whether `line` closes a block opened by `fence`: the same character, at least as many, alone."""
    bare = line.strip()
    return bare.startswith(fence) and not bare.strip(fence[0])


def _runnable(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.language in SHELL and b.needs is None]


def _skipped() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.language in SHELL and b.needs is not None]


def _script(file_blocks: list[Block], state: Path) -> str:
    parts = ["set -euo pipefail"]
    for n, block in enumerate(file_blocks):
        parts.append(f"printf '%s\\n' {n} > {_quote(state)}")
        parts.append(f"# --- {block.where}")
        parts.append(block.text)
    # Every background job must have been stopped by the blocks themselves.
    parts.append(f"printf '%s\\n' end > {_quote(state)}")
    parts.append("for _ in $(seq 100); do [ -z \"$(jobs -rp)\" ] && exit 0; sleep 0.05; done")
    parts.append("echo 'background jobs still running after the last block:' >&2; jobs -l >&2; exit 97")
    return "\n".join(parts) + "\n"


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def _env(scratch: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("HEDDLE_", "OPENAI_", "XDG_")) and k not in ("SOURCE_DATE_EPOCH",)}
    bin_dir = Path(sys.executable).parent
    home = scratch / "home"
    env = {
        **keep,
        "PATH": f"{bin_dir}{os.pathsep}{keep.get('PATH', '')}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "HEDDLE_CACHE_DIR": str(scratch / "heddle-cache"),
        "HEDDLE_TRUST_DIR": str(scratch / "heddle-trust"),
        "NO_COLOR": "1",
    }
    return env


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    shutil.copytree(REPO / "examples", tmp_path / "examples", symlinks=True)
    return tmp_path


def test_every_fence_names_its_language() -> None:
    untagged = [b.where for path in DOCS for b in blocks(path) if not b.language]
    assert not untagged, f"fences without a language (use sh for commands, text for output): {untagged}"


@pytest.mark.parametrize("path", [p for p in DOCS if _runnable(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_shell_blocks_run_as_written(path: Path, scratch: Path) -> None:
    file_blocks = _runnable(path)
    state = scratch / ".block"
    script = scratch / "blocks.sh"
    script.write_text(_script(file_blocks, state), encoding="utf-8")
    # Files, not pipes: a job left running would hold a pipe open after bash exits.
    out_path, err_path = scratch / ".stdout", scratch / ".stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        start = scratch / path.parent.relative_to(REPO) if path.name == "README.md" else scratch
        start.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(["bash", str(script)], cwd=start, env=_env(scratch), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Whatever a failed file left behind (a model server, say) goes with its process group.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if proc.returncode == 0 and not timed_out:
        return
    reached = state.read_text().strip() if state.exists() else "0"
    if reached == "end":
        where = f"{path.relative_to(REPO)} (after its last block)"
    else:
        block = file_blocks[int(reached)]
        where = f"the block at {block.where}:\n{block.text}"
    why = f"timed out after {TIMEOUT:.0f} s" if timed_out else f"exited {proc.returncode}"
    pytest.fail(f"{why} in {where}\n--- stdout (end)\n{stdout[-3000:]}\n--- stderr (end)\n{stderr[-3000:]}")


@pytest.mark.parametrize("block", _skipped() or [None], ids=lambda b: b.where if b else "none")
def test_blocks_that_need_more_than_a_scratch_folder_are_skipped_with_the_reason(block: Block | None) -> None:
    if block is None:
        return
    pytest.skip(f"{block.where} needs {block.needs}; the suite runs blocks in a scratch folder and never calls a "
                "vendor")
