"""`heddle push` and `heddle pull` show a progress bar for a large bundle on a terminal (a pty here),
and never in a pipe, under NO_COLOR or with -q."""

from __future__ import annotations

import os
import pty
import subprocess
import threading
from pathlib import Path

import pytest

from heddle import seal
from heddle.format.limits import MiB
from tests.support.cli import BIN, env_with
from tests.support.flows import FlowDoc
from tests.support.registry import RunningRegistry

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle over the bar's threshold (16 MiB): a mount of bytes zstd cannot shrink."""
    root = tmp_path_factory.mktemp("big")
    (root / "data").mkdir()
    (root / "data" / "noise.bin").write_bytes(os.urandom(17 * MiB))
    f = FlowDoc("big")
    start, end = f.start(["text"]), f.end(["text"])
    f.control(start, end)
    return seal(f.write(root / "flow.json"), mounts=[f"{root / 'data'}:data"], output=root / "big.heddle").path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    for name in ("cache", "trust", "home"):
        (tmp_path / name).mkdir()
    env = env_with({"HEDDLE_CACHE_DIR": str(tmp_path / "cache"), "HEDDLE_TRUST_DIR": str(tmp_path / "trust"),
                    "HOME": str(tmp_path / "home"), "TERM": "xterm-256color", "COLUMNS": "100"})
    for name in ("NO_COLOR", "DOCKER_CONFIG", "HEDDLE_REGISTRY_USERNAME", "HEDDLE_REGISTRY_PASSWORD"):
        env.pop(name, None)
    return env


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """(exit status, what the command wrote on its terminal): stderr is a pty, stdout a pipe."""
    leader, follower = pty.openpty()
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        proc = subprocess.run([str(BIN / "heddle"), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=follower, env=env, timeout=100, check=False)
    finally:
        os.close(follower)
        reader.join(timeout=10)
        os.close(leader)
    return proc.returncode, seen.decode(errors="replace")


def test_push_and_pull_show_a_bar_on_a_terminal_only(registry: RunningRegistry, big: Path, tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    ref = registry.ref("agents/big:v1")
    rc, shown = _on_a_terminal(["push", str(big), ref], env)
    assert rc == 0, shown
    assert "pushing agents/big" in shown and "MiB" in shown, shown
    rc, shown = _on_a_terminal(["pull", ref, "-o", str(tmp_path / "a.heddle")], env)
    assert rc == 0, shown
    assert "pulling agents/big" in shown and "17.0 MiB" in shown, shown
    assert (tmp_path / "a.heddle").read_bytes() == big.read_bytes()
    # The same pull with NO_COLOR, with -q, and with stderr a pipe: no bar (a new cache each, so each downloads).
    for n, (extra, args) in enumerate([({"NO_COLOR": "1"}, []), ({}, ["-q"])]):
        cache = tmp_path / f"cache{n}"
        cache.mkdir()
        rc, shown = _on_a_terminal(["pull", ref, "-o", str(tmp_path / f"b{n}.heddle"), *args],
                                   {**env, **extra, "HEDDLE_CACHE_DIR": str(cache)})
        assert rc == 0 and "pulling" not in shown and "\x1b[" not in shown, shown
    (tmp_path / "cache-pipe").mkdir()
    piped = subprocess.run([str(BIN / "heddle"), "pull", ref, "-o", str(tmp_path / "c.heddle")], capture_output=True,
                           text=True, env={**env, "HEDDLE_CACHE_DIR": str(tmp_path / "cache-pipe")}, timeout=100,
                           stdin=subprocess.DEVNULL, check=False)
    assert piped.returncode == 0 and "pulling" not in piped.stderr, piped.stderr
