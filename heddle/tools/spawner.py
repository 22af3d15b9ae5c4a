"""heddle's side of the reaper server (heddle/tools/reaper.py): one per heddle process.

Starting a Python interpreter for each tool call's reaper cost tens of milliseconds of CPU a
call; the server is started once, on the first call, and forks a reaper per call. A call is
one message on a Unix socket carrying the call's pipes, so every pipe the tool and its reaper
hold was made here, and heddle keeps the other ends: the tool's stdin, stdout and stderr, the
status pipe whose end is the call's end, and the control pipe whose closing stops the call.

The server gets an empty environment and none of heddle's descriptors (its stdin, stdout and
stderr are /dev/null): a tool gets the environment its call names and the pipes its call made,
and nothing of heddle's own, so a process a tool leaves behind never holds `heddle run | cat`
open. A call's own failures reach heddle as the call's stderr. It runs in a session of its own,
so a terminal's Ctrl-C reaches heddle, which then stops its calls, and not the server. It ends
when its socket closes, which is at the latest when heddle ends.
"""

from __future__ import annotations

import atexit
import functools
import marshal
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REAPER = Path(__file__).with_name("reaper.py")
# Seconds heddle's exit waits for the server to notice its socket closed.
EXIT_WAIT = 2.0


@functools.cache
def available() -> bool:
    """Whether tool calls can run under a reaper here (Linux, with a Python to run it): asked
    once per process, not at every call."""
    return (sys.platform.startswith("linux") and bool(sys.executable)
            and not getattr(sys, "frozen", False) and REAPER.is_file())


@dataclass(frozen=True)
class CallPipes:
    """heddle's ends of one call's pipes (each close-on-exec, each to be closed by the caller)."""

    stdin: int
    stdout: int
    stderr: int
    status: int
    control: int


class Spawner:
    """The reaper server of this process, started on first use and again if it has died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        # Servers of a parent this process was forked from: kept referenced, never waited for.
        self._inherited: list[subprocess.Popen[bytes]] = []

    def _start(self) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(REAPER), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env={}, start_new_session=True,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        return mine

    def prestart(self) -> None:
        """Start the server now, where no call waits for it yet (nothing if it runs, or cannot)."""
        if self._sock is not None or not available():
            return
        with self._lock:
            if self._sock is None:
                try:
                    self._start()
                except OSError:
                    pass  # the first call starts it, and says why it cannot

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.poll()  # a dead server is collected; a live one ends on the closed socket
            self._proc = None

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> CallPipes:
        """Start one call; OSError when the server cannot be started or reached."""
        body = marshal.dumps({"argv": [os.fspath(arg) for arg in argv], "env": dict(env), "cwd": cwd})
        head = len(body).to_bytes(4, "big")
        made: list[int] = []
        try:
            ends = []
            for _ in range(5):
                ends.append(os.pipe())
                made.extend(ends[-1])
            (in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w), (ctl_r, ctl_w) = ends
            theirs = [in_r, out_w, err_w, st_w, ctl_r]
            with self._lock:
                for attempt in (1, 2):
                    sock = self._sock or self._start()
                    try:
                        socket.send_fds(sock, [head], theirs)
                        sock.sendall(body)
                        break
                    except (BrokenPipeError, ConnectionResetError):
                        # The server died (killed from outside); a server that did not read the
                        # whole request started nothing, so the call goes to a new one.
                        self._drop()
                        if attempt == 2:
                            raise
            for fd in theirs:
                os.close(fd)
            made = []
            return CallPipes(in_w, out_r, err_r, st_r, ctl_w)
        finally:
            for fd in made:
                os.close(fd)

    def close(self) -> None:
        with self._lock:
            proc = self._proc
            self._drop()
        if proc is not None:
            try:
                proc.wait(EXIT_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's server is the parent's; this process starts its own."""
        self._lock = threading.Lock()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._inherited.append(self._proc)
            self._proc = None


SPAWNER = Spawner()
atexit.register(SPAWNER.close)
os.register_at_fork(after_in_child=SPAWNER.forget_after_fork)
