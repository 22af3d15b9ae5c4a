"""The parent of every tool process on Linux, so that nothing a tool started outlives its call.

Run as a script, never imported by heddle: `python -I -S reaper.py SOCKET_FD`. Standard library
only, and nothing that needs site-packages.

One such process serves one heddle process for its whole life (heddle/tools/spawner.py starts
it on the first call), so a call costs a fork of this small interpreter, not the start of a new
one. Each request on the socket is one call: a 4-byte big-endian length and, with it, five file
descriptors (the tool's stdin, stdout and stderr, a status pipe, a control pipe), then that
many bytes of `marshal` data (this same interpreter wrote it; marshal, unlike json, costs no
import): `{"argv": [...], "env": {...}, "cwd": "..." or None}`. For each, this
process forks a per-call reaper, and collects it as it exits: so every process of a call is
waited for by its parent, and the CPU time of each is counted in heddle's own children's times,
as a tool's was when heddle started it directly.

The per-call reaper starts a session of its own, marks itself a child subreaper, starts the
tool with exactly the environment it was given, and once the tool has exited kills everything
the tool left behind. A process group does not reach a child that called `setsid()`, and an
orphan normally goes to init; as a subreaper the per-call reaper becomes the parent of every
orphan below it, so its own children after the tool's exit are exactly the tool's leftovers,
whatever sessions they made. One reaper per call keeps calls that run at the same time apart.

A request `{"listener": PORT}` comes with three descriptors instead: the read end of a sandbox's
bubblewrap `--info-fd`, the write end of its `--block-fd`, and a socket to answer heddle on; it is made
for a sandboxed tool call under an egress allow-list, whose sandbox makes a fresh user and network
namespace, reports them and holds its program. The fork made for it waits for the report, enters the
sandbox's user and network namespaces (made by its own user, so it may), makes a socket listening on
127.0.0.1:PORT there and sends it to heddle (a socket stays in the namespace it was made in wherever its
descriptor goes: heddle's egress proxy accepts on it), lets the program start, and ends. So the call
costs one short-lived fork of this process, made while bubblewrap starts, and no process of its own
while it runs; the listener is its namespace's only way out.

The call is stopped (heddle's timeout or cancellation, or heddle's death) when heddle closes its
end of the control pipe; SIGTERM, SIGHUP and SIGINT stop it as well. The tool and its leftovers
are killed. The status pipe gets `pid N` (the per-call reaper, a session leader) and then one
last line: `exit N` (N negative for a signal, as subprocess reports it), `exec ERRNO` when the
tool could not be started, `cwd ERRNO` when its folder could not be entered. The pipe's end is
the call's end. The server itself ends when heddle closes the socket.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import marshal
import os
import select
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
IP_FREEBIND = 15
INFO_CAP = 4096  # bytes of bubblewrap's --info-fd report
HEADER = 4
CALL_FDS = 5
LISTENER_FDS = 3

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
# Ignored here (and so inherited by a fork), or ignored by Python at start-up: a tool gets them
# at their defaults, as from any shell.
RESET_SIGNALS = (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT)


# Loaded, and its functions looked up, once in the server: each fork then finds them ready (a fork that
# loads them pays for it on every call).
_LIBC = ctypes.CDLL(None, use_errno=True)
_PRCTL, _SETNS = _LIBC.prctl, _LIBC.setns


def _prctl(option: int, value: int) -> None:
    if _PRCTL(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _setns(fd: int, kind: int) -> None:
    if _SETNS(fd, kind) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


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
    """Our children, from /proc: the list the kernel keeps of a task's children where it has one (this
    process is single-threaded, so its main thread's are all of them), else a scan of every process (a
    kernel without /proc/PID/task/TID/children is common), which costs milliseconds on a busy machine."""
    me = os.getpid()
    try:
        with open(f"/proc/self/task/{me}/children", "rb") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
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


def listen_in(port: int, fds: Sequence[int]) -> None:
    """Make a sandbox's listener (in a fork of the server; see the module's docstring). `fds`: the read end of
    its bubblewrap --info-fd, the write end of its --block-fd, a socket to answer heddle on."""
    info, block, answer = fds[0], fds[1], socket.socket(fileno=fds[2])
    try:
        report = b""
        while not report.rstrip().endswith(b"}"):
            data = os.read(info, INFO_CAP)
            if not data:
                raise OSError(errno.EPIPE, "bubblewrap ended before reporting its sandbox")
            report += data
            if len(report) > INFO_CAP:
                raise OSError(errno.EPROTO, "bubblewrap's report is too long")
        pid, inode = _number(report, b"child-pid"), _number(report, b"net-namespace")
        if pid is None or inode is None:
            raise OSError(errno.EPROTO, "bubblewrap reported no network namespace")
        # Its user namespace first, then its network namespace, whose number is checked against the report:
        # a process that ended and whose number went to another is not the sandbox.
        user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(net).st_ino != inode:
            raise OSError(errno.ESRCH, "the sandbox ended before its network namespace was reached")
        _setns(user, CLONE_NEWUSER)
        _setns(net, CLONE_NEWNET)
        listener = socket.socket()
        # Bound before the sandbox brings its loopback up: the address is the namespace's own once it is.
        listener.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        socket.send_fds(answer, [b"ok"], [listener.fileno()])
        os.write(block, b"go")  # the sandbox's program starts
    except OSError as exc:
        # The reason in words too: heddle's one line says what failed, not only the errno's name.
        with contextlib.suppress(OSError):
            answer.send(f"error {exc.errno or 0} {exc.strerror or exc}"[:200].encode("ascii", "replace"))


def _number(report: bytes, name: bytes) -> int | None:
    """The number given for `name` in bubblewrap's --info-fd report (a flat JSON object of numbers, which
    bubblewrap writes itself), read without json: an import this fork would pay on every call."""
    start = report.find(b'"' + name + b'":')
    if start < 0:
        return None
    digits = report[start + len(name) + 3:].lstrip().split(b",")[0].split(b"}")[0].strip()
    return int(digits) if digits.isdigit() else None


def _start(argv: Sequence[str], env: Mapping[str, str], stdio: Sequence[int]) -> tuple[int, int | None]:
    """Fork and exec the tool on `stdio`; (pid, errno) with errno set when the exec failed."""
    read_end, write_end = os.pipe()  # both close on exec
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            for signum in RESET_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            os.execvpe(argv[0], list(argv), dict(env))
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        failure = f.read()
    return pid, int(failure) if failure else None


def _wait_tool(pid: int, control: int, wakeup: int) -> int:
    """Wait for the tool to exit, killing it when the call is stopped; its wait status."""
    poller = select.poll()
    poller.register(wakeup, select.POLLIN)
    poller.register(control, select.POLLIN)
    stopped = False
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return wait_status
        events = poller.poll()
        signals = b""
        for fd, _ in events:
            if fd == wakeup:
                signals += os.read(wakeup, 64)
        stop = any(fd == control for fd, _ in events) or any(s in signals for s in STOP_SIGNALS)
        if stop and not stopped:
            # The tool's pid is only signalled here, before this same thread collects it, so never
            # after its number may have been reused.
            _kill(pid)
            stopped = True
            poller.unregister(control)  # it stays readable once closed


def _report(status: int, line: str) -> None:
    os.write(status, f"{line}\n".encode())


def call(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    """Be one call's reaper (in a fork of the server): start the tool, wait, clean up, report."""
    stdin, stdout, stderr, status, control = fds
    os.setsid()
    # Its own failures show as the tool's stderr, where heddle reads them.
    os.dup2(stderr, 2)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    for signum in (signal.SIGCHLD, *STOP_SIGNALS):
        # A handler, so the signal is neither discarded as ignored nor fatal: the wakeup pipe takes it.
        signal.signal(signum, lambda signum, frame: None)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _report(status, f"pid {os.getpid()}")
    cwd = request.get("cwd")
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError as exc:
            _report(status, f"cwd {exc.errno or 0}")
            return
    pid, failure = _start(request["argv"], request["env"], (stdin, stdout, stderr))
    # The tool owns its stdin and stdout; holding them here would hide its exit from heddle's
    # reads and writes.
    for fd in (stdin, stdout, stderr):
        os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    wait_status = _wait_tool(pid, control, wakeup_read)
    kill_leftovers()
    _report(status, f"exec {failure}" if failure is not None else f"exit {os.waitstatus_to_exitcode(wait_status)}")


def _read_exactly(sock: socket.socket, n: int, start: bytes = b"") -> bytes | None:
    data = start
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next request and its descriptors; None when heddle has gone."""
    # Close-on-exec, so that a tool holds its stdin, stdout and stderr alone: neither this call's
    # status and control pipes nor another call's. Not socket.recv_fds, which drops its flags.
    head, ancillary, _, _ = sock.recvmsg(HEADER, socket.CMSG_SPACE(CALL_FDS * 4), socket.MSG_CMSG_CLOEXEC)
    fds = _fds(ancillary)
    if not head:
        return None
    whole = _read_exactly(sock, HEADER, head)
    body = _read_exactly(sock, int.from_bytes(whole, "big")) if whole is not None else None
    if body is None:
        return None
    request = marshal.loads(body)
    if len(fds) != (LISTENER_FDS if "listener" in request else CALL_FDS):
        for fd in fds:
            os.close(fd)
        return {}, []
    return request, fds


def _fds(ancillary: Sequence[tuple[int, int, bytes]]) -> list[int]:
    received = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received.frombytes(data[:len(data) - len(data) % received.itemsize])
    return list(received)


def _forked(request: Mapping[str, Any], fds: Sequence[int]) -> None:
    """In the child of a fork: be the call's reaper, then end without returning into the server's loop."""
    code = 0
    try:
        call(request, fds)
    except Exception:  # noqa: BLE001 (any failure: shown on the call's stderr, where heddle reports it)
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _collect(signum: int = 0, frame: object = None) -> None:
    """Collect every per-call reaper that has exited (SIGCHLD's handler)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(sock: socket.socket) -> int:
    signal.signal(signal.SIGCHLD, _collect)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)  # only the end of the socket ends the server
    while True:
        received = _receive(sock)
        if received is None:
            # heddle has gone, and with it the control pipes: the calls still running stop now.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                while True:
                    os.wait()
            except ChildProcessError:
                return 0
        request, fds = received
        if not fds:
            continue
        port = request.get("listener")
        try:
            pid = os.fork()
        except OSError as exc:
            if port is None:
                _report(fds[3], f"fork {exc.errno or 0}")
            else:  # on the answer's end, which heddle reads as the refusal
                with contextlib.suppress(OSError):
                    os.write(fds[2], f"error {exc.errno or 0} the tool runner could not fork".encode())
            pid = -1
        if pid == 0:
            sock.close()
            if port is not None:
                try:
                    listen_in(port, fds)
                finally:
                    os._exit(0)
            _forked(request, fds)
        for fd in fds:
            os.close(fd)


def main(args: list[str]) -> int:
    if len(args) != 1 or not args[0].isdigit():
        print("usage: reaper.py SOCKET_FD (started by heddle)", file=sys.stderr)
        return 2
    return serve(socket.socket(fileno=int(args[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
