"""The parent of one tool process on Linux, so that nothing the tool started outlives its call.

Run as a script (`python -I -S reaper.py STATUS_FD PARENT_PID [-u NAME]... -- ARGV...`, never
imported by heddle; each `-u NAME` is a variable the tool must not get, as Python's start-up sets
LC_CTYPE in an environment that has no locale):
it marks itself a child subreaper, starts the tool, and once the tool has exited kills
everything the tool left behind. A process group does not reach a child that called
`setsid()`, and an orphan normally goes to init; as a subreaper this process becomes the
parent of every orphan below it, so its own children after the tool's exit are exactly the
tool's leftovers, whatever sessions they made. One reaper per call keeps calls that run at
the same time apart, and leaves heddle's own processes alone.

SIGTERM (heddle's timeout or cancellation) or the death of heddle itself kills the tool and
the same leftovers. The outcome goes to STATUS_FD as one line: `exit N` (N negative for a
signal, as subprocess reports it) or `exec ERRNO` when the tool could not be started.
Standard library only, and nothing that needs site-packages.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# Blocked, and taken one at a time with sigwaitinfo: the tool's pid is then only ever signalled
# before this same thread collects it, never after its number may have been reused.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
WAITED = STOP_SIGNALS | {signal.SIGCHLD}


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _kill(pid: int) -> bool:
    """SIGKILL `pid`; False when it cannot be signalled (another user's process)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    return True


def _children() -> list[int]:
    """Our children, from /proc (a kernel without /proc/PID/task/TID/children is common)."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold anything, so fields count from the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _reap_available() -> bool:
    """Collect every child that has exited; False when there are no children at all."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_leftovers() -> None:
    """Kill and collect every child until none is left (a killed child's own children are
    handed to us in turn)."""
    unkillable: set[int] = set()
    while _reap_available():
        pending = [pid for pid in _children() if pid not in unkillable]
        if not pending:
            return
        for pid in pending:
            if not _kill(pid):
                unkillable.add(pid)
        if all(pid in unkillable for pid in pending):
            return
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _start(argv: list[str], mask: Iterable[int], unset: Iterable[str] = ()) -> tuple[int, int | None]:
    """Fork and exec the tool; (pid, errno) with errno set when the exec failed."""
    read_end, write_end = os.pipe()  # both close on exec
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            for name in unset:
                os.environ.pop(name, None)
            # The mask and ignored signals survive exec: the tool gets the mask heddle gave us
            # and the default SIGPIPE and SIGXFSZ that Python set aside at start-up.
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        failure = f.read()
    return pid, int(failure) if failure else None


def _wait_tool(pid: int) -> int:
    """Wait for the tool to exit, killing it on a stop signal; its wait status."""
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return wait_status
        if signal.sigwaitinfo(WAITED).si_signo in STOP_SIGNALS:
            _kill(pid)


def main(args: list[str]) -> int:
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    # A handler, so SIGCHLD is never discarded as ignored before sigwaitinfo takes it.
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    status_fd, parent, *rest = args
    unset: list[str] = []
    while len(rest) >= 2 and rest[0] == "-u":
        unset.append(rest[1])
        rest = rest[2:]
    sep, *argv = rest if rest else [""]
    status = int(status_fd)
    os.set_inheritable(status, False)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent) or sep != "--" or not argv:
        return 1  # heddle died before the death signal was armed, or a misuse
    pid, failure = _start(argv, mask, unset)
    # The tool owns stdin and stdout; holding them here would hide its exit from heddle's
    # reads and writes. stderr stays, for this program's own failures.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    wait_status = _wait_tool(pid)
    kill_leftovers()
    line = f"exec {failure}" if failure is not None else f"exit {os.waitstatus_to_exitcode(wait_status)}"
    os.write(status, f"{line}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
