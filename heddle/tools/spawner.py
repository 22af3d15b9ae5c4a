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

A sandboxed call under an egress allow-list asks the server for its network namespace's one listener
(OwnNetwork, Spawner.ask_listener): a fork of the server makes it there (see reaper.py).
"""

from __future__ import annotations

import array
import atexit
import errno
import functools
import marshal
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from heddle import textsafe

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

    def _send(self, request: Mapping[str, object], fds: Sequence[int]) -> None:
        """One request to the server, with `fds` (the caller's to close); held under the lock."""
        body = marshal.dumps(dict(request))
        head = len(body).to_bytes(4, "big")
        for attempt in (1, 2):
            sock = self._sock or self._start()
            try:
                socket.send_fds(sock, [head], fds)
                sock.sendall(body)
                return
            except (BrokenPipeError, ConnectionResetError):
                # The server died (killed from outside); a server that did not read the
                # whole request started nothing, so the request goes to a new one.
                self._drop()
                if attempt == 2:
                    raise

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> CallPipes:
        """Start one call; OSError when the server cannot be started or reached."""
        request: dict[str, object] = {"argv": [os.fspath(arg) for arg in argv], "env": dict(env), "cwd": cwd}
        made: list[int] = []
        try:
            ends = []
            for _ in range(5):
                ends.append(os.pipe())
                made.extend(ends[-1])
            (in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w), (ctl_r, ctl_w) = ends
            theirs = [in_r, out_w, err_w, st_w, ctl_r]
            with self._lock:
                self._send(request, theirs)
            for fd in theirs:
                os.close(fd)
            made = []
            return CallPipes(in_w, out_r, err_r, st_r, ctl_w)
        finally:
            for fd in made:
                os.close(fd)

    def ask_listener(self, info: int, block: int, port: int) -> socket.socket:
        """Ask for a socket listening on 127.0.0.1:`port` in the network namespace of the sandbox that reports
        on `info` and waits on `block` (own_network_argv; both descriptors the caller's to close): a fork of
        the server makes it there and lets the sandbox's program start. The answer comes on the socket
        returned (see `take_listener`); OSError when the server cannot be started or reached."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with theirs, self._lock:
                self._send({"listener": port}, [info, block, theirs.fileno()])
        except BaseException:
            mine.close()
            raise
        return mine

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


def _refusal(message: bytes, otherwise: str) -> OSError:
    kind, _, value = message.decode("ascii", "replace").partition(" ")
    number, _, why = value.partition(" ")
    if kind == "error" and number.isdigit():
        return OSError(int(number), textsafe.printable(why) or os.strerror(int(number)))
    return OSError(errno.EIO, otherwise)


def received_fds(ancillary: Sequence[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an SCM_RIGHTS message carried (the reaper reads its own the same way: it is a
    standalone script that imports nothing of heddle)."""
    received = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received.frombytes(data[:len(data) - len(data) % received.itemsize])
    return list(received)


def take_listener(answer: socket.socket) -> socket.socket:
    """The listener sent on `answer` (readable by now), which is then closed; OSError
    when it could make none."""
    with answer:
        # Close-on-exec as it arrives (not socket.recv_fds, which drops the flag): a tool another thread
        # starts meanwhile must never hold a listener of a sandbox's proxy.
        message, ancillary, _, _ = answer.recvmsg(256, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
    fds = received_fds(ancillary)
    if message != b"ok" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise _refusal(message, "the tool runner ended without making it")
    return socket.socket(fileno=fds[0])


@dataclass(frozen=True)
class OwnNetwork:
    """What a sandboxed call that gets a network namespace of its own is given in it: a listener on
    127.0.0.1:`port`, made before the call's program starts (its first connections wait in the backlog)
    and handed to `adopt`, which takes it."""

    port: int
    adopt: Callable[[socket.socket], Awaitable[None]]


# Seconds the start of a call's network namespace (and the probe of one) may take.
PROBE_WAIT = 10.0


def own_network_argv(argv: Sequence[str], info: int, block: int) -> list[str]:
    """A bubblewrap command line (one with `--unshare-net`) made to report its namespaces on `info` and hold
    its program until `block` is written to (Spawner.ask_listener)."""
    return [argv[0], "--info-fd", str(info), "--block-fd", str(block), *argv[1:]]


@functools.cache
def own_network_problem(port: int, argv: tuple[str, ...]) -> str | None:
    """None when a sandbox can be given a network namespace of its own with a listener in it here (the
    bubblewrap command line `argv`, which must exit 0, run so once: see OwnNetwork), else why not. Asked
    once per process."""
    import select

    if not available():
        return "no tool runner here (it needs Linux and a Python interpreter)"
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    try:
        answer = SPAWNER.ask_listener(info_r, block_w, port)
    except OSError as exc:
        os.close(block_w)
        return f"the tool runner could not be started: {exc.strerror or exc}"
    finally:
        os.close(info_r)
    try:
        proc = subprocess.Popen(own_network_argv(argv, info_w, block_r),
                                pass_fds=(info_w, block_r), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as exc:
        answer.close()
        os.close(block_w)
        return f"cannot run {argv[0]}: {exc.strerror or exc}"
    finally:
        os.close(info_w)
        os.close(block_r)
    problem = None
    try:
        if not select.select([answer], [], [], PROBE_WAIT)[0]:
            raise TimeoutError("no listener was made in time")
        take_listener(answer).close()
    except OSError as exc:
        problem = str(exc.strerror or exc)
        proc.kill()
    finally:
        answer.close()
        os.close(block_w)  # held till now, so that a fork that failed cannot let the program start
    try:
        _, err = proc.communicate(timeout=PROBE_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    lines = err.decode("utf-8", "replace").strip().splitlines()
    if problem is None and proc.returncode != 0:
        problem = lines[-1] if lines else f"exit status {proc.returncode}"
    elif problem is not None and lines:
        problem = f"{problem} ({lines[-1]})"  # bubblewrap's own word, where it ended first
    return None if problem is None else f"a network namespace with a listener cannot be made here: {problem}"


SPAWNER = Spawner()
atexit.register(SPAWNER.close)
os.register_at_fork(after_in_child=SPAWNER.forget_after_fork)
