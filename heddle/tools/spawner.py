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

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
              netns: tuple[str, int] | None = None) -> CallPipes:
        """Start one call; OSError when the server cannot be started or reached. `netns` (a Unix socket and
        a port): the call runs in a network namespace of its own, whose relay on that port is its only way
        out (heddle.tools.reaper)."""
        request: dict[str, object] = {"argv": [os.fspath(arg) for arg in argv], "env": dict(env), "cwd": cwd}
        if netns is not None:
            request["netns"] = [netns[0], netns[1]]
        body = marshal.dumps(request)
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


# Seconds the probe of a network namespace may take.
PROBE_WAIT = 10.0


@functools.cache
def own_network_problem(port: int, argv: tuple[str, ...] = ("true",)) -> str | None:
    """None when a call can be given a network namespace of its own by its reaper here (see `spawn`), else
    why not: asked once per process, by running `argv` (which must exit 0) so."""
    import select

    if not available():
        return "no tool runner here (it needs Linux and a Python interpreter)"
    try:
        pipes = SPAWNER.spawn(argv, {"PATH": "/usr/bin:/bin"}, None, netns=("/", port))
    except OSError as exc:
        return f"the tool runner could not be started: {exc.strerror or exc}"
    os.close(pipes.stdin)
    report = b""
    try:
        while select.select([pipes.status], [], [], PROBE_WAIT)[0]:
            data = os.read(pipes.status, 4096)
            if not data:
                break
            report += data
    finally:
        for fd in (pipes.stdout, pipes.stderr, pipes.status, pipes.control):
            os.close(fd)
    last = (report.decode("ascii", "replace").strip().splitlines() or [""])[-1]
    kind, _, value = last.partition(" ")
    if last == "exit 0":
        return None
    if kind == "netns" and value.isdigit():
        return f"a network namespace cannot be made here: {os.strerror(int(value))}"
    return f"the probe of a network namespace ended with {last or 'no report'!r}"


SPAWNER = Spawner()
atexit.register(SPAWNER.close)
os.register_at_fork(after_in_child=SPAWNER.forget_after_fork)
