"""A body read from the network within a cap on its bytes once decoded, and a deadline.

httpx decodes a `Content-Encoding` one received chunk at a time, whole: a few KiB of gzip or
zstd can become gigabytes in one call, before any cap sees them. Here the raw bytes are read
(`aiter_raw`/`iter_raw`) and decoded by decoders that hand on at most `STEP` bytes at a time
(zlib's `max_length`; zstd fed a few bytes at a time, each zstd block being at most 128 KiB,
with its window held to `ZSTD_MAX_WINDOW`), so the cap is counted on what was decoded, and
memory stays within the cap plus one step. A coding heddle cannot decode this way (`br`, or
one it does not know) is refused, never passed on as if it were the body.

The deadline is on the whole transfer: an async reader runs within `asyncio.timeout_at`; a
sync client's sockets keep it (`keep_deadline`: each connect, read and write waits no later),
and a sync reader checks it at each chunk too. Silence is ended sooner by the client's own read
timeout, the idle limit.

Only the standard library is imported here until a body is read.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import httpx

KiB = 1024
MiB = 1024 * KiB
# The most bytes a decoder hands on at once.
STEP = 64 * KiB
# zstd's input is fed this many bytes at a time: a block is at least 4 bytes and decodes to at
# most 128 KiB, so one feed decodes to at most ~2 MiB.
_ZSTD_FEED = 64
# The largest zstd window a body may ask for (RFC 8878 asks decoders to support 8 MiB).
ZSTD_MAX_WINDOW = 8 * MiB
# Content codings applied one over another that a body may have.
MAX_CODINGS = 2
# What heddle asks servers for: only what it decodes within the cap.
ACCEPT_ENCODING = "gzip, deflate, zstd"


class BodyError(Exception):
    """A body over its cap, past its deadline, or not decodable: one line naming its source."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def size_text(count: int) -> str:
    """`count` bytes as a person reads it: 10 MiB, 64 KiB, 1500 bytes."""
    for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if count >= size and count % size == 0:
            return f"{count // size} {unit}"
    return f"{count} bytes"


class Decoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...

    def end(self) -> Iterator[bytes]: ...


class _Identity:
    def feed(self, data: bytes) -> Iterator[bytes]:
        for at in range(0, len(data), STEP):
            yield data[at:at + STEP]

    def end(self) -> Iterator[bytes]:
        return iter(())


class _Zlib:
    """gzip, or deflate (zlib-wrapped, or raw as some servers send it)."""

    def __init__(self, gzip: bool) -> None:
        self._raw_fallback = not gzip
        self._obj = zlib.decompressobj(zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS)
        self._fed = False

    def _drain(self, data: bytes) -> Iterator[bytes]:
        while True:
            out = self._obj.decompress(data, STEP)
            data = self._obj.unconsumed_tail
            if out:
                yield out
            if self._obj.eof or (not data and len(out) < STEP):
                return

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._fed = self._fed or bool(data)
        if self._raw_fallback and data:
            self._raw_fallback = False
            try:
                first = self._obj.decompress(data, STEP)
            except zlib.error:
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
            else:
                if first:
                    yield first
                data = self._obj.unconsumed_tail
                if not data and len(first) < STEP:
                    return
        yield from self._drain(data)

    def end(self) -> Iterator[bytes]:
        yield from self._drain(b"")
        if self._fed and not self._obj.eof:
            # Cut short: what was decoded is not the whole body.
            raise ValueError("the compressed stream is incomplete")


class _Zstd:
    def __init__(self) -> None:
        import zstandard

        self._new = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).decompressobj
        self._error = zstandard.ZstdError
        self._obj = self._new()
        self._open = False  # inside a frame

    def feed(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        for at in range(0, len(view), _ZSTD_FEED):
            piece = bytes(view[at:at + _ZSTD_FEED])
            while piece:
                if self._obj.eof:
                    self._obj = self._new()
                try:
                    out = self._obj.decompress(piece)
                except self._error as exc:
                    raise ValueError(str(exc)) from None
                self._open = not self._obj.eof
                piece = self._obj.unused_data if self._obj.eof else b""
                yield from _Identity().feed(out)

    def end(self) -> Iterator[bytes]:
        if self._open:
            raise ValueError("the zstd frame is incomplete")
        yield from ()


def decoder(content_encoding: str, what: str) -> Decoder:
    """The decoder of a body sent with this Content-Encoding header: `feed` and `end` hand on at most
    a few MiB at a time. BodyError naming `what` for a coding heddle does not decode so."""
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip().lower() not in ("", "identity")]
    if len(codings) > MAX_CODINGS:
        raise BodyError(f"{what}: the answer is encoded {len(codings)} times over ({content_encoding}); heddle "
                        f"decodes at most {MAX_CODINGS}")
    try:
        return _decoder(codings)
    except KeyError as exc:
        raise BodyError(f"{what}: the answer is {exc.args[0]}-encoded, which heddle does not decode (it asks "
                        f"for {ACCEPT_ENCODING})") from None


def _decoder(codings: list[str]) -> Decoder:
    made: list[Decoder] = []
    for coding in codings:
        if coding in ("gzip", "x-gzip"):
            made.append(_Zlib(gzip=True))
        elif coding == "deflate":
            made.append(_Zlib(gzip=False))
        elif coding == "zstd":
            made.append(_Zstd())
        else:
            raise KeyError(coding)
    if not made:
        return _Identity()
    return made[0] if len(made) == 1 else _Chain(list(reversed(made)))


class _Chain:
    """Codings applied one over another, undone last first, each piece passed on as it comes."""

    def __init__(self, decoders: list[Decoder]) -> None:
        self._decoders = decoders

    def _through(self, pieces: Iterator[bytes], index: int) -> Iterator[bytes]:
        if index == len(self._decoders):
            yield from pieces
            return
        decoder = self._decoders[index]
        for piece in pieces:
            yield from self._through(decoder.feed(piece), index + 1)

    def feed(self, data: bytes) -> Iterator[bytes]:
        return self._through(iter((data,)), 0)

    def end(self) -> Iterator[bytes]:
        for index, decoder in enumerate(self._decoders):
            yield from self._through(decoder.end(), index + 1)


def _held(response: httpx.Response) -> bytes | None:
    import httpx

    try:
        return response.content
    except httpx.ResponseNotRead:
        return None


class Body:
    """How one response is read: `what` names its source in errors, `cap` its decoded bytes,
    `cap_text` how the cap is set (a flag, or "the cap of a registry's manifest")."""

    def __init__(self, response: httpx.Response, *, what: str, cap: int, cap_text: str) -> None:
        self.what = what
        self.cap = cap
        self.cap_text = cap_text
        self.count = 0
        self.over = False  # the cap was passed (or a declared length is past it)
        self._response = response
        self._held = _held(response)
        if self._held is not None:
            # Read into memory before it got here (a response made in memory): already decoded.
            self._decoder: Decoder = _Identity()
            return
        self._decoder = decoder(response.headers.get("content-encoding", ""), what)

    def _over(self) -> BodyError:
        self.over = True
        how = f" ({self.cap_text})" if self.cap_text else ""
        return BodyError(f"{self.what}: the answer is over {size_text(self.cap)} once decoded{how}; it was not read "
                         "further")

    def _count(self, pieces: Iterator[bytes]) -> Iterator[bytes]:
        try:
            for piece in pieces:
                self.count += len(piece)
                if self.count > self.cap:
                    raise self._over()
                yield piece
        except (zlib.error, ValueError) as exc:
            raise BodyError(f"{self.what}: the answer's content encoding is broken: {exc}") from None

    def declared_over(self) -> bool:
        """The answer states a length over the cap (checked for an identity body only: an encoded
        one may decode to less than its length)."""
        declared = self._response.headers.get("content-length", "")
        return not self._response.headers.get("content-encoding") and declared.isdigit() and int(declared) > self.cap

    async def chunks(self) -> AsyncIterator[bytes]:
        """The decoded body, at most `STEP` bytes at a time; BodyError past the cap."""
        if self.declared_over():
            raise self._over()
        if self._held is not None:
            for piece in self._count(self._decoder.feed(self._held)):
                yield piece
            return
        async for raw in self._response.aiter_raw():
            for piece in self._count(self._decoder.feed(raw)):
                yield piece
        for piece in self._count(self._decoder.end()):
            yield piece

    def iter_chunks(self, deadline_at: float | None = None, deadline_text: str = "") -> Iterator[bytes]:
        """`chunks` for a sync client; past `deadline_at` (time.monotonic()) a BodyError saying
        `deadline_text`."""
        if self.declared_over():
            raise self._over()
        if self._held is not None:
            yield from self._count(self._decoder.feed(self._held))
            return
        for raw in self._response.iter_raw():
            if deadline_at is not None and time.monotonic() > deadline_at:
                raise BodyError(f"{self.what}: the transfer did not finish within {deadline_text}")
            yield from self._count(self._decoder.feed(raw))
        yield from self._count(self._decoder.end())


async def read_body(response: httpx.Response, *, what: str, cap: int, cap_text: str,
                    deadline_at: float | None = None, deadline_text: str = "") -> bytes:
    """The whole decoded body within `cap` bytes, finished by `deadline_at` (the loop's time);
    BodyError otherwise."""
    out = bytearray()
    body = Body(response, what=what, cap=cap, cap_text=cap_text)
    try:
        async with asyncio.timeout_at(deadline_at):
            async for piece in body.chunks():
                out += piece
    except BaseException as exc:
        # The error's traceback keeps this frame alive until a collection: not the bytes read.
        out.clear()
        if isinstance(exc, TimeoutError):
            raise BodyError(f"{what}: the transfer did not finish within {deadline_text}") from None
        raise
    return bytes(out)


def keep_deadline(client: httpx.Client, deadline_at: Callable[[], float | None]) -> None:
    """Make every socket operation of `client` (connect, each read and write, on its own transport and on
    the proxies it mounted from the environment) wait at most until `deadline_at()` (time.monotonic(),
    or None for none), beside its own timeout: a sync client's only way to end, at a deadline, a
    transfer whose server drips bytes, headers included. (The pools' network backends are wrapped;
    should httpx ever hold them otherwise, `Body.iter_chunks` still checks the deadline at each chunk.)"""
    import httpcore

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream) -> None:
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._inner.read(max_bytes, _within(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._inner.write(buffer, _within(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                      timeout: float | None = None) -> httpcore.NetworkStream:
            within = _within(timeout, httpcore.ConnectTimeout)
            return Stream(self._inner.start_tls(ssl_context, server_hostname, within))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self, inner: httpcore.NetworkBackend) -> None:
            self._inner = inner

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
            return Stream(self._inner.connect_tcp(host, port, _within(timeout, httpcore.ConnectTimeout),
                                                  local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None,
                                socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
            return Stream(self._inner.connect_unix_socket(path, _within(timeout, httpcore.ConnectTimeout),
                                                          socket_options))

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    def _within(timeout: float | None, error: type[Exception]) -> float | None:
        at = deadline_at()
        if at is None:
            return timeout
        left = at - time.monotonic()
        if left <= 0:
            raise error("the transfer's deadline has passed")
        return left if timeout is None else min(timeout, left)

    for transport in (client._transport, *client._mounts.values()):
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend):
            pool._network_backend = Backend(backend)  # type: ignore[union-attr]
