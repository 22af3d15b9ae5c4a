"""`heddle push` and `heddle pull` show a progress bar for a large bundle on a terminal (a pty here),
and never in a pipe, under NO_COLOR or with -q."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from heddle import seal
from heddle.format.limits import MiB
from tests.support.cli import BIN, env_with
from tests.support.cli_inproc_proc import heddle_here
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
                                                     env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.cli import app
    from heddle.cli.errors import run_app

    ref = registry.ref("agents/big:v1")
    rc, shown = _on_a_terminal(["push", str(big), ref], env)
    assert rc == 0, shown
    assert "pushing agents/big" in shown and "MiB" in shown, shown
    rc, shown = _on_a_terminal(["pull", ref, "-o", str(tmp_path / "a.heddle")], env)
    assert rc == 0, shown
    assert "pulling agents/big" in shown and "17.0 MiB" in shown, shown
    assert (tmp_path / "a.heddle").read_bytes() == big.read_bytes()
    # The same pull with NO_COLOR, with -q, and with stderr a pipe: no bar (a new cache each, so each downloads).
    # By the CLI's entry function in this process (the real process above shows where the bar goes), its
    # stderr a stream that says it is a terminal, as the pty does, and no bar on it.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in set(os.environ) - set(env):
        monkeypatch.delenv(name)
    from heddle.cli.progress import terminal_progress

    for n, (extra, args) in enumerate([({"NO_COLOR": "1"}, []), ({}, ["-q"])]):
        with monkeypatch.context() as patch:
            terminal = _Terminal()
            patch.setattr(sys, "stderr", terminal)
            assert terminal_progress() is not None  # as this stream stands, a pull would draw its bar on it
            for name, value in {**extra, "HEDDLE_CACHE_DIR": str(tmp_path / f"cache{n}")}.items():
                patch.setenv(name, value)
            Path(os.environ["HEDDLE_CACHE_DIR"]).mkdir()
            rc = run_app(app, ["pull", ref, "-o", str(tmp_path / f"b{n}.heddle"), *args])
        assert rc == 0 and "pulling" not in terminal.text and "\x1b[" not in terminal.text, terminal.text
        assert (tmp_path / f"b{n}.heddle").read_bytes() == big.read_bytes()
    with monkeypatch.context() as patch:
        patch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache-pipe"))
        (tmp_path / "cache-pipe").mkdir()
        piped = heddle_here(capsys, "pull", ref, "-o", str(tmp_path / "c.heddle"))
    assert piped.returncode == 0 and "pulling" not in piped.stderr, piped.stderr
    assert (tmp_path / "c.heddle").read_bytes() == big.read_bytes()


class _Terminal(io.StringIO):
    """What the command writes on its stderr, which says it is a terminal."""

    text = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.text += s
        return len(s)
