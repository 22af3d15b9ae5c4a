"""Serving: the port opened only after everything checked, and the drain on the first signal.

First SIGTERM or SIGINT: readiness turns 503, new runs get 503, runs in flight finish, then the
process exits 0. Runs still going after `--drain-timeout` are cancelled (their callers get 503)
before it exits. A second signal stops at once, cancelling every run, and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
from collections.abc import Callable, Iterator

import uvicorn

from heddle.server.errors import ServeError
from heddle.server.service import Service
from heddle.settings import SERVER
from heddle.textsafe import write_line

log = logging.getLogger("heddle.server")

# After a drain timeout, how long cancelled runs get to kill their tools and answer.
CANCEL_GRACE_S = 5.0


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0 = any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ServeError(f"cannot listen on {host}:{port} ({reason}); choose another --host or --port") from None


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _say(message: str) -> None:
    write_line(sys.stderr, f"heddle-server: {message}")


class _LogLines(logging.Handler):
    """The server's log (its own records and uvicorn's): each record printable lines on stderr.
    A write that fails (the reader of stderr gone) is dropped: a log line never stops a drain."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 (a record that cannot be formatted is logging's to report)
            self.handleError(record)
            return
        write_line(sys.stderr, text)


def configure_log(log_format: str, log_level: str) -> None:
    """The process's log on stderr, as `--log-format` and `--log-level` say (once: a process that has
    handlers already, a test's, keeps them)."""
    from heddle.server.access import LogLines

    handler = _LogLines()
    handler.setFormatter(LogLines("heddle-server: ", json_lines=log_format == "json"))
    # The libraries' own records (httpx logs every request's full URL, query and all) stay at warnings:
    # a URL a tool was called with may carry its arguments.
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("heddle").setLevel(log_level.upper())
    # What LogLines never shows is not gathered for every record (a line a request): the caller's
    # file and line, thread and process (logging's documented switches).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


class DrainingServer(uvicorn.Server):
    """uvicorn's server with heddle's signal handling: drain first, exit on the second signal."""

    def __init__(self, config: uvicorn.Config, service: Service, *, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.service = service
        self.exit_code = 0
        self._on_ready = on_ready
        self._drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.service.sessions is not None:
            # A store reached on first use (a plugin's process) is reached now, before anything is served.
            await self.service.sessions.open()
        await super().startup(sockets)
        if self.started:
            if self.service.follower is not None:
                self.service.follower.start()
            if self.service.recovery is not None:
                self.service.recovery.start()
            self._on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.service.recovery is not None:
            await self.service.recovery.aclose()
        if self.service.follower is not None:
            self.service.follower.stop()
            await self.service.follower.wait_stopped()
        # Every run has ended (or been cancelled): the plugin processes they shared can stop.
        await self.service.aclose()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Replaces uvicorn's handlers, which would stop accepting connections at once and
        # re-raise the signal after shutdown; a drain must keep answering 503 meanwhile.
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, self._signalled, sig)
        try:
            yield
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _signalled(self, sig: int) -> None:
        admission = self.service.admission
        if self._drain is None:
            self._drain = self.service.tasks.start(self._drain_then_exit(), name="drain")
            _say(f"{signal.Signals(sig).name}: draining ({admission.active} run(s) in flight, up to "
                 f"{SERVER.duration(self.service.config.drain_timeout)}); a second signal stops at once")
            return
        cancelled = admission.cancel_all()
        _say(f"{signal.Signals(sig).name} again: stopping now, {cancelled} run(s) cancelled")
        self.exit_code = 1
        self.force_exit = True
        self.should_exit = True

    async def _drain_then_exit(self) -> None:
        admission = self.service.admission
        admission.start_draining()
        # The port stays open for --drain-delay at least: a load balancer that has not yet seen /readyz turn
        # 503 still sends requests, which a closed port would refuse, or reset once they were sent.
        loop = asyncio.get_running_loop()
        until = loop.time() + self.service.config.drain_delay
        if self.service.recovery is not None:
            await self.service.recovery.stop()  # runs it recovered drain as the others do
        if self.service.follower is not None:
            # No bundle is swapped in while the runs in flight drain.
            self.service.follower.stop()
        if not await admission.wait_idle(self.service.config.drain_timeout):
            cancelled = admission.cancel_all()
            _say(f"--drain-timeout passed: {cancelled} run(s) cancelled")
            await admission.wait_idle(CANCEL_GRACE_S)
        await asyncio.sleep(max(0.0, until - loop.time()))
        self.should_exit = True


def serve(service: Service, *, on_ready: Callable[[str], None]) -> int:
    """Open the port, serve until drained, and return the exit status."""
    from heddle.server.app import build_app
    from heddle.server.config import DEFAULT_MAX_CONNECTIONS
    from heddle.server.connections import Limits, protocol_class

    config = service.config
    limits = Limits(header_timeout=config.header_timeout, body_timeout=config.body_timeout,
                    max_connections=config.max_connections or DEFAULT_MAX_CONNECTIONS)
    sock = bind(config.host, config.port)
    url = url_of(sock)
    configure_log(config.log_format, config.log_level)
    uv_config = uvicorn.Config(build_app(service), lifespan="off", log_config=None, log_level="warning",
                               access_log=False, timeout_graceful_shutdown=5, server_header=False,
                               http=protocol_class(limits))
    server = DrainingServer(uv_config, service, on_ready=lambda: on_ready(url))
    # What start-up made (the modules, the document models, the served edition) lives as long as the
    # process: kept out of the cyclic collector's full passes, each of which would walk all of it (some
    # 50,000 objects, tens of ms) while every request in flight waits. Its own cycles, should a following
    # server retire the first edition, are then left uncollected: once, and no more than that edition.
    gc.freeze()
    with sock:
        server.run(sockets=[sock])
    return server.exit_code
