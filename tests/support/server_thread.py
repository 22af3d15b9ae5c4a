"""`heddle-server ARGS` served from a thread of the test process, for tests whose subject is what the
server answers, not its process.

    with threaded_server(tmp_path, "--flows-root", flows, "--tools-dir", tools) as server:
        with server.client() as client:
            assert client.post("/v1/runs", json={...}).status_code == 200

The command's own entry function (heddle.server.cli.run) reads the flags and the environment,
checks them, opens a bundle, builds the service and calls `serve`, which opens a port the system
picks and serves the same app with the same connection limits, from a thread: only its signal
handling is left out (a thread cannot take signals; the drain on SIGTERM is tested on real
processes in tests/server/test_lifecycle.py). Tools and plugins are real subprocesses, as ever.
What it prints, and what it logs (a traceback, say) as the process logs it to its stderr, goes to
the test's captured stderr (`capsys`); what it logs is also kept in `logged()`, for a server a
whole module shares. Refusals at start-up raise here; the error line the command printed is in
the captured stderr. tests/server/support.py starts the real process.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import env_with

START_TIMEOUT_S = 30.0


class _Log(logging.Handler):
    """Each record the server's thread logs, as the process writes it to its stderr: to this
    process's stderr as it is at the time (a test's capture), and kept."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("heddle-server: %(message)s"))
        self.lines: list[str] = []
        self.thread: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread:
            return  # another part of this test process, not the server
        line = self.format(record)
        self.lines.append(line)
        sys.stderr.write(line + "\n")


class Reachable:
    """A server at `url`: its port, and a client of it (with a bearer token, when given)."""

    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def client(self, token: str | None = None, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)


@dataclass
class ThreadedServer(Reachable):
    url: str
    _server: Any = field(repr=False)  # the serving DrainingServer, to stop it
    _thread: threading.Thread = field(repr=False)
    _status: list[int] = field(repr=False)
    _log: _Log = field(repr=False)

    def logged(self) -> str:
        """What the server has logged so far (a traceback of a request that failed, say)."""
        return "\n".join(self._log.lines)

    def stop(self) -> int:
        """Stop serving as the drain's end does (runs in flight finish first); the exit status."""
        self._server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the threaded heddle-server did not stop"
        assert self._status, "the threaded heddle-server ended by an exception (its traceback is on stderr)"
        return self._status[0]


@contextlib.contextmanager
def threaded_server(tmp_path: Path, *args: object, env: dict[str, str] | None = None) -> Iterator[ThreadedServer]:
    """Serve `heddle-server --port 0 ARGS` from a thread until the block ends (then stop it)."""
    from heddle.server import cli
    from heddle.server.serve import DrainingServer

    tmp_path.mkdir(parents=True, exist_ok=True)
    argv = ["--port", "0", *[str(a) for a in args]]
    ready: queue.Queue[str | None] = queue.Queue()
    made: list[DrainingServer] = []
    status: list[int] = []
    original_init = DrainingServer.__init__

    def init(self: DrainingServer, *a: Any, **k: Any) -> None:
        original_init(self, *a, **k)
        made.append(self)

    def no_signals(self: DrainingServer) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def serve() -> None:
        try:
            status.append(cli.run(argv, env_with(env)))
        finally:
            ready.put(None)  # a start-up refusal returns before announcing

    # The process logs to its stderr (`logging.basicConfig` in serve, a no-op here, where the test
    # runner's handlers are installed already): the same lines, to this test's stderr.
    logged = _Log()
    root = logging.getLogger()
    with contextlib.ExitStack() as cleanup, pytest.MonkeyPatch.context() as patch:
        root.addHandler(logged)
        cleanup.callback(root.removeHandler, logged)
        # --work-dir points this process's temporary folders at it, as it does the server's.
        patch.setattr(tempfile, "tempdir", tempfile.tempdir)
        patch.setattr(DrainingServer, "__init__", init)
        patch.setattr(DrainingServer, "capture_signals", no_signals)
        patch.setattr(cli, "_announce", ready.put)
        thread = threading.Thread(target=serve, name="heddle-server", daemon=True)
        thread.start()
        logged.thread = thread.ident
        try:
            url = ready.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"the threaded heddle-server did not start within {START_TIMEOUT_S:.0f} s") from None
        if url is None:
            thread.join(10)
            raise AssertionError(f"heddle-server {' '.join(argv)} refused to start (exit {status[:1]}); "
                                 "its error line is in the captured stderr")
        server = ThreadedServer(url, made[-1], thread, status, logged)
        try:
            yield server
        finally:
            if thread.is_alive():
                server.stop()
            sys.stderr.flush()
