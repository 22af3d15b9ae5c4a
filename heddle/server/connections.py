"""Connections: deadlines for slow clients and a cap on how many may be open.

uvicorn closes an idle keep-alive connection, but not one that opened and says nothing, nor
one that sends its headers a byte at a time; a thousand of those hold a thousand descriptors
until the process runs out and real requests hang. This is uvicorn's h11 protocol with:

- a header deadline (`--header-timeout`), from when a connection opens, or from the first byte
  of a later request on it, until the request's headers are in;
- a body deadline (`--body-timeout`), from the headers until the whole body is in;
- a cap (`--max-connections`): past it a new connection is answered 503 at once and closed,
  so it costs a descriptor for a moment, not for as long as the client likes.

A missed deadline is answered 408 with the server's usual error body, and the connection closed.
"""

from __future__ import annotations

import asyncio
import http
import json
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from heddle.errors import UsageError
from heddle.server.errors import error_body
from heddle.settings import SERVER
from heddle.tcp import no_delay

# How long a refused connection is kept to read what the client sends, so closing it does not
# reset the connection before the client has read the 503.
REFUSE_LINGER_S = 1.0


@dataclass(frozen=True)
class Limits:
    header_timeout: float  # seconds
    body_timeout: float  # seconds
    max_connections: int


def _raw_response(status: int, type_: str, message: str, *headers: str) -> bytes:
    body = json.dumps(error_body(type_, message), ensure_ascii=False).encode("utf-8")
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Coalesced:
    """A connection's transport whose writes made in one pass of the event loop leave in one send:
    an answer's head and body (uvicorn writes the head as the response starts) make one segment
    and one system call, not two; with TCP_NODELAY each write would be a segment of its own.
    What is written goes out at the end of the pass, in order, and before the connection closes."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the cap of `limits` (set by `protocol_class`)."""

    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" or "body": what the armed deadline waits for
        self._refused = False

    # ------------------------------------------------------------------ the cap

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        no_delay(transport)
        if len(self.connections) >= self.limits.max_connections:
            self._refuse(transport)
            return
        super().connection_made(_Coalesced(transport, self.loop))  # type: ignore[arg-type]
        self._arm("headers")

    def _refuse(self, transport: asyncio.Transport) -> None:
        self._refused = True
        self.transport = transport
        n = self.limits.max_connections
        transport.write(_raw_response(503, "too_many_connections",
                                      f"this server already has {n} open connections (--max-connections {n}); "
                                      "retry later", "retry-after: 1"))
        if transport.can_write_eof():
            transport.write_eof()
        self._deadline = self.loop.call_later(min(REFUSE_LINGER_S, self.limits.header_timeout), transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: the answer is already sent
        super().data_received(data)
        self._track(data_arrived=True)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()
            return
        super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused:
            return
        super().connection_lost(exc)

    # ------------------------------------------------------------------ the deadlines

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            # uvicorn's keep-alive timer watches the silence before a next request.
            self._track(data_arrived=False)

    def _track(self, *, data_arrived: bool) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:
            if data_arrived:
                self._arm("headers")
            else:
                self._disarm()
        elif state is h11.SEND_BODY:
            self._arm("body")
        else:
            self._disarm()

    def _arm(self, phase: str) -> None:
        if self._phase == phase:
            return
        self._disarm()
        timeout = self.limits.header_timeout if phase == "headers" else self.limits.body_timeout
        self._phase = phase
        self._deadline = self.loop.call_later(timeout, self._expired, phase)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = None

    def _expired(self, phase: str) -> None:
        self._deadline = None
        self._phase = None
        if self.transport.is_closing():
            return
        cycle = self.cycle if phase == "body" else None
        if cycle is None or not cycle.response_started:
            if phase == "headers":
                what, setting = "line and headers", f"--header-timeout {SERVER.duration(self.limits.header_timeout)}"
            else:
                what, setting = "body", f"--body-timeout {SERVER.duration(self.limits.body_timeout)}"
            self.transport.write(_raw_response(408, "request_timeout",
                                               f"the request's {what} did not arrive within {setting}; "
                                               "the connection is closed"))
        if cycle is not None:
            # The route waiting for the body hears the client leave; it must not answer on top of the 408.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def protocol_class(limits: Limits) -> type[GuardedH11Protocol]:
    """The protocol uvicorn instantiates per connection, bound to this server's limits."""
    return type("HeddleH11Protocol", (GuardedH11Protocol,), {"limits": limits})


def reserved_descriptors(max_concurrent: int) -> int:
    """Descriptors kept free of connections for the runs themselves: tool pipes, model
    connections, workspace files, plugins."""
    return 32 + 16 * max_concurrent


def connection_cap(requested: int | None, default: int, max_concurrent: int) -> tuple[int, str | None]:
    """The connection cap this process can hold, raising its open-file limit if it may, and a
    warning when the default had to be lowered. An explicit --max-connections that cannot fit
    is refused rather than quietly lowered."""
    wanted = default if requested is None else requested
    reserve = reserved_descriptors(max_concurrent)
    need = wanted + reserve
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, None
    fit = soft - reserve
    if requested is not None or fit < 1:
        raise UsageError(f"--max-connections {wanted}: the open-file limit is {soft} (ulimit -n) and runs need "
                         f"{reserve} of them; give --max-connections {max(fit, 1)} or less, or raise the limit")
    return fit, (f"--max-connections lowered from {wanted} to {fit}: the open-file limit is {soft} (ulimit -n) "
                 f"and runs need {reserve} of them; raise the limit for more connections")
