"""Who runs a session's unfinished run: its owner and the lease the owner renews while it runs.

A run that writes an unfinished (`running`) record names itself in it: the process, the host it
runs on, a token of the run, and until when its lease holds. The owner renews the lease while the
run goes on (every third of the lease). Another process may take the run over (`--resume`, or a
server recovering the runs of a replica that died) only once the owner is gone: its lease expired,
or, on the same host, its process no longer exists. Taking over is the store's compare-and-swap on
the record's version, so of several takers exactly one proceeds; an owner that finds its record
taken stops its run.

The owner is part of the sealed record, so a store's writer without the session key cannot forge a
lease any more than a result. Leases compare wall clocks: replicas sharing a store keep their clocks
within a small part of the lease of each other (NTP does).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

# The runs of this process that are going on, by token: a lease of this process whose run ended
# (it failed and its record kept it) is no longer held, whatever its time says.
_RUNNING: set[str] = set()


def _space() -> str:
    """This process's pid namespace on this boot of this machine, where a pid names one process: two
    processes of one space can tell whether the other's pid is alive; others rely on the lease."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(path) if path.endswith("/pid") else Path(path).read_text().strip())
        except OSError:
            return ""  # no way to tell: only the lease decides
    return "|".join(parts)


_SPACE = _space()


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    run: str  # a random token of the run, so that a pid used again is not taken for the owner
    until: float  # Unix seconds: when the lease ends unless it is renewed
    space: str = ""  # _space() of the owner's process ("" when it could not tell)

    def describe(self) -> str:
        return f"process {self.pid} on host {self.host}"

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "run": self.run, "until": self.until, "space": self.space}

    @classmethod
    def from_json(cls, raw: Any) -> Owner:
        if not isinstance(raw, dict) or set(raw) != {"host", "pid", "run", "until", "space"}:
            raise ValueError("an owner that is not {host, pid, run, until, space}")
        host, pid, run, until, space = raw["host"], raw["pid"], raw["run"], raw["until"], raw["space"]
        if not (isinstance(host, str) and isinstance(run, str) and isinstance(space, str)
                and isinstance(pid, int) and not isinstance(pid, bool)
                and isinstance(until, (int, float)) and not isinstance(until, bool)):
            raise TypeError("an owner of the wrong shape")
        return cls(host, pid, run, float(until), space)

    def renewed(self, lease: float) -> Owner:
        return replace(self, until=time.time() + lease)

    def holds(self, now: float | None = None) -> bool:
        """Whether the owner still holds the run: its lease runs, and its process is not known to be gone."""
        if _SPACE and self.space == _SPACE:
            if self.pid == os.getpid():
                if self.run not in _RUNNING:
                    return False
            elif not _alive(self.pid):
                return False
        return self.until > (time.time() if now is None else now)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that pid: alive
    return True


def new_owner(lease: float) -> Owner:
    """An owner for a run of this process starting now; `running` registers it while the run goes on."""
    return Owner(socket.gethostname(), os.getpid(), secrets.token_hex(8), time.time() + lease, _SPACE)


@contextlib.contextmanager
def running(owner: Owner) -> Iterator[Owner]:
    """While the run of `owner` goes on in this process."""
    _RUNNING.add(owner.run)
    try:
        yield owner
    finally:
        _RUNNING.discard(owner.run)
