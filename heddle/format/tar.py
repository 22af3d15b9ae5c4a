"""The one tar dialect a bundle speaks: POSIX ustar, regular files only, written and read here.

Reading is done header by header from a stream, never through an extractor: the caller
decides what each entry may be and where its bytes go, so a link, a device or a name that
climbs is refused before anything is created for it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from heddle.format.errors import MalformedBundleError

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
NAME_BYTES = 100
PREFIX_BYTES = 155
MAX_SIZE = 8**11 - 1  # what 11 octal digits hold: the largest size, and the latest mtime

REGULAR = "0"
DIRECTORY = "5"

TYPE_NAMES = {
    "1": "a hard link",
    "2": "a symbolic link",
    "3": "a character device",
    "4": "a block device",
    "5": "a directory",
    "6": "a FIFO",
    "7": "a contiguous file",
    "g": "a pax global header",
    "x": "a pax extended header",
    "K": "a GNU long link name",
    "L": "a GNU long name",
    "S": "a sparse file",
    "V": "a volume label",
}


def describe_type(typeflag: str) -> str:
    return TYPE_NAMES.get(typeflag, f"an entry of unknown type {typeflag!r}")


def padding(size: int) -> int:
    return -size % BLOCK


def entry_span(size: int) -> int:
    """Bytes one entry of `size` data bytes takes: its header plus padded data."""
    return BLOCK + size + padding(size)


def split_name(name: str) -> tuple[str, str] | None:
    """Fit `name` into ustar's (prefix, name) fields, or None when it cannot be stored.

    A name over 100 bytes is split at the last '/' at byte offset 155 or less.
    """
    raw = name.encode("utf-8")
    if len(raw) <= NAME_BYTES:
        return "", name
    cut = raw.rfind(b"/", 0, PREFIX_BYTES + 1)
    if cut <= 0:
        return None
    head, tail = raw[:cut], raw[cut + 1 :]
    if not tail or len(tail) > NAME_BYTES:
        return None
    return head.decode("utf-8"), tail.decode("utf-8")


def _octal(value: int, width: int) -> bytes:
    return format(value, "o").rjust(width - 1, "0").encode("ascii") + b"\0"


_ZERO_OCTAL = _octal(0, 8)
_OWNERS = _ZERO_OCTAL * 2
# The fields after the checksum up to the prefix, the same in every header: typeflag, an empty
# linkname, magic, version, empty owner names, devices 0.
_AFTER_CHECKSUM = REGULAR.encode() + bytes(100) + b"ustar\0" + b"00" + bytes(64) + _ZERO_OCTAL * 2
# What the fixed fields add to the checksum, which counts its own field as eight spaces.
_FIXED_SUM = sum(_OWNERS) + 8 * 0x20 + sum(_AFTER_CHECKSUM)
_TAIL = bytes(12)


def header(name: str, size: int, mode: int, mtime: int) -> bytes:
    """The header of a regular file, byte for byte as SPEC.md describes it."""
    # Written once a file: the short name's case and each number formatted by C (`_octal`'s digits).
    name_field = name.encode("utf-8")
    prefix_field = b""
    if len(name_field) > NAME_BYTES:
        split = split_name(name)
        if split is None:
            raise ValueError(f"{name!r} does not fit a ustar header")
        prefix_field, name_field = split[0].encode("utf-8"), split[1].encode("utf-8")
    # A wider number would not be cut: it would shift every later field of the header.
    if not (0 <= size <= MAX_SIZE and 0 <= mtime <= MAX_SIZE and 0 <= mode < 8**7):
        raise ValueError(f"{name!r}: size {size}, mtime {mtime} or mode {mode:o} does not fit a ustar header")
    mode_field, times = b"%07o\0" % mode, b"%011o\0%011o\0" % (size, mtime)
    total = _FIXED_SUM + sum(name_field) + sum(prefix_field) + sum(mode_field) + sum(times)
    return b"".join((
        name_field.ljust(NAME_BYTES, b"\0"), mode_field, _OWNERS, times, b"%06o\0 " % total,
        _AFTER_CHECKSUM, prefix_field.ljust(PREFIX_BYTES, b"\0"), _TAIL,
    ))


@dataclass(frozen=True)
class TarHeader:
    name: str
    typeflag: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime: int
    linkname: str
    offset: int

    @property
    def is_regular(self) -> bool:
        return self.typeflag in (REGULAR, "\0")


def _field_octal(block: bytes, start: int, end: int, what: str, offset: int) -> int:
    raw = block[start:end]
    if raw and raw[0] & 0x80:
        raise MalformedBundleError(f"tar header at byte {offset}: {what} uses base-256, which a bundle never does")
    text = raw.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if text.translate(None, b"01234567"):
        raise MalformedBundleError(f"tar header at byte {offset}: {what} is not an octal number")
    return int(text, 8)


def _field_text(block: bytes, start: int, end: int, what: str, offset: int) -> str:
    raw = block[start:end].split(b"\0", 1)[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedBundleError(f"tar header at byte {offset}: {what} is not UTF-8") from None


_ROOT_OWNER = b"0000000\x000000000\x00"


def parse_header(block: bytes, offset: int, *, strict: bool = True) -> TarHeader:
    """Decode one header block. `strict` demands the POSIX magic a bundle writer uses."""
    recorded = _field_octal(block, 148, 156, "checksum", offset)
    actual = sum(block) - sum(block[148:156]) + 8 * 0x20
    if recorded != actual:
        raise MalformedBundleError(f"tar header at byte {offset}: checksum mismatch (corrupt or not a tar)")
    magic = block[257:265]
    if magic != b"ustar\x0000" and (strict or magic != b"ustar  \x00"):
        raise MalformedBundleError(f"tar header at byte {offset}: not a POSIX ustar header")
    name = _field_text(block, 0, 100, "name", offset)
    prefix = _field_text(block, 345, 500, "prefix", offset)
    if block[108:124] == _ROOT_OWNER:  # what every bundle writer puts there
        uid = gid = 0
    else:
        uid = _field_octal(block, 108, 116, "uid", offset)
        gid = _field_octal(block, 116, 124, "gid", offset)
    return TarHeader(
        name=f"{prefix}/{name}" if prefix else name,
        typeflag=chr(block[156]),
        size=_field_octal(block, 124, 136, "size", offset),
        mode=_field_octal(block, 100, 108, "mode", offset),
        uid=uid,
        gid=gid,
        mtime=_field_octal(block, 136, 148, "mtime", offset),
        linkname="" if block[157] == 0 else _field_text(block, 157, 257, "linkname", offset),
        offset=offset,
    )


class Readable(Protocol):
    def readinto(self, buffer: memoryview) -> int: ...


# (a buffer the reader is done with, the call that hands it back to be filled again)
Retire = Callable[[bytearray, Callable[[bytearray], None]], None]


_ZERO_BLOCK = bytes(BLOCK)
# Room before each buffer's data for the unread tail of the previous one: a header or a
# padding is at most one block, so that tail is always shorter than a block.
_HEADROOM = BLOCK


class _Spent:
    """A stream a read-ahead thread had: at its end, or not to be read again (what the
    thread had read past the reader's position is gone with it)."""

    def __init__(self, ended: bool) -> None:
        self._ended = ended

    def readinto(self, buffer: memoryview) -> int:
        if self._ended:
            return 0
        raise RuntimeError("this tar reader's stream was read ahead on a thread and is used up")


class _Ahead:
    """A thread filling buffers from the stream while the reader consumes the previous ones,
    so decompressing overlaps hashing and writing."""

    def __init__(self, raw: Readable, size: int, count: int) -> None:
        self._raw = raw
        self._free: queue.SimpleQueue[bytearray | None] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(bytearray(size))
        self._filled: queue.SimpleQueue[tuple[bytearray, int] | BaseException] = queue.SimpleQueue()
        self._stop = False
        self.ended = False  # the stream's end was read
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="heddle-read-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                buffer = self._free.get()
                if buffer is None or self._stop:
                    return
                n = self._raw.readinto(memoryview(buffer)[_HEADROOM:])
                self._filled.put((buffer, n))
                if not n:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it where the bytes were due
            self._filled.put(exc)

    def next(self) -> tuple[bytearray, int]:
        """The next filled buffer and how many bytes it holds after its headroom (0: the end)."""
        if self._failed is not None:
            raise self._failed
        item = self._filled.get()
        if isinstance(item, BaseException):
            self._failed = item
            raise item
        self.ended = not item[1]
        return item

    def release(self, buffer: bytearray) -> None:
        self._free.put(buffer)

    def close(self) -> None:
        self._stop = True
        self._free.put(None)
        self._thread.join()


class TarReader:
    """Walks a tar stream entry by entry; the caller consumes each entry's data in turn.

    Reads go through one buffer, so a run of small entries costs one call to the
    decompressor per megabyte rather than three per entry. Inside `reading_ahead()`, a
    thread fills the next buffers while the caller works on this one.
    """

    CHUNK = 1 << 20
    AHEAD = 3  # buffers a read-ahead thread may fill before the reader takes them

    def __init__(self, raw: Readable, *, what: str, strict: bool = True) -> None:
        self._raw = raw
        self._what = what
        self._strict = strict
        self.offset = 0
        self._buffer = bytearray(_HEADROOM + self.CHUNK)
        self._view = memoryview(self._buffer)
        self._pos = _HEADROOM
        self._end = _HEADROOM
        self._ahead: _Ahead | None = None
        self._retire: Retire | None = None

    @contextlib.contextmanager
    def reading_ahead(self, retire: Retire | None = None) -> Iterator[None]:
        """Decompress ahead on a thread for the block's duration. The stream is the thread's
        from then on: once the block ends, the reader has nothing more to give.

        The views the reader hands out stay valid until it moves to its next buffer; with
        `retire`, longer: a buffer it has moved past goes to `retire(buffer, release)`, and is
        filled again only once `release(buffer)` is called (by whoever still reads its views).
        """
        if self._ahead is not None:
            yield
            return
        ahead = _Ahead(self._raw, len(self._buffer), self.AHEAD + (self.AHEAD if retire is not None else 0))
        self._ahead, self._raw, self._retire = ahead, _Spent(False), retire
        try:
            yield
        finally:
            ahead.close()
            self._ahead, self._raw, self._retire = None, _Spent(ahead.ended), None

    def _refill(self) -> int:
        """Keep the unread bytes, read more after them; 0 at the end of the stream."""
        left = self._end - self._pos
        tail = bytes(self._view[self._pos : self._end])
        ahead = self._ahead
        if ahead is None:
            buffer, view = self._buffer, self._view
            n = self._raw.readinto(view[_HEADROOM:])
        elif ahead.ended:
            return 0
        else:
            buffer, n = ahead.next()
            view = memoryview(buffer)
            if self._retire is not None:
                self._retire(self._buffer, ahead.release)
            else:
                ahead.release(self._buffer)
        view[_HEADROOM - left : _HEADROOM] = tail
        self._buffer, self._view = buffer, view
        self._pos, self._end = _HEADROOM - left, _HEADROOM + n
        return n

    def _take(self, n: int, during: str) -> memoryview:
        """Exactly `n` (at most one block) contiguous bytes, valid until the next read."""
        while self._end - self._pos < n:
            if not self._refill():
                raise MalformedBundleError(f"{self._what} is truncated in {during}")
        view = self._view[self._pos : self._pos + n]
        self._pos += n
        self.offset += n
        return view

    def _take_some(self, n: int, during: str) -> memoryview:
        """Between 1 and `n` bytes, whatever is buffered first."""
        if self._pos == self._end and not self._refill():
            raise MalformedBundleError(f"{self._what} is truncated in {during}")
        k = min(n, self._end - self._pos)
        view = self._view[self._pos : self._pos + k]
        self._pos += k
        self.offset += k
        return view

    def next_header(self, expected: tuple[str, int, int, int] | None = None) -> TarHeader | None:
        """The next entry's header, or None at the end-of-archive marker.

        Given the (name, size, mode, mtime) the entry is due to have, a block that is byte for
        byte the header `header()` writes for them is taken without being parsed: every field a
        parse checks is then what it would have found (the checksum too). Any other block is
        parsed and checked field by field, as without `expected`.
        """
        at = self.offset
        block = bytes(self._take(BLOCK, f"the header at byte {at}"))
        if expected is not None:
            name, size, mode, mtime = expected
            try:
                due = header(name, size, mode, mtime)
            except ValueError:  # no packer could have written it: parsed below, and refused there
                due = b""
            if block == due:
                return TarHeader(name, REGULAR, size, mode, 0, 0, mtime, "", at)
        if block == _ZERO_BLOCK:
            if self._take(BLOCK, "the end-of-archive marker") != _ZERO_BLOCK:
                raise MalformedBundleError(f"{self._what}: a lone zero block at byte {at} is followed by data")
            return None
        return parse_header(block, at, strict=self._strict)

    def copy_data(self, entry: TarHeader, sink: Callable[[memoryview], object]) -> None:
        """Feed the entry's data to `sink` in chunks, then check its padding is zeros."""
        left = entry.size
        while left:
            view = self._take_some(left, f"the data of {entry.name!r}")
            sink(view)
            left -= len(view)
        pad = padding(entry.size)
        if pad and self._take(pad, f"the padding of {entry.name!r}") != _ZERO_BLOCK[:pad]:
            raise MalformedBundleError(f"{self._what}: the padding after {entry.name!r} is not zeros")

    def read_data(self, entry: TarHeader) -> bytes:
        parts: list[bytes] = []
        self.copy_data(entry, lambda v: parts.append(bytes(v)))
        return b"".join(parts)

    def expect_end(self, *, allow_zeros: bool = False) -> None:
        """Nothing may follow the end-of-archive marker inside the compressed stream.

        `allow_zeros` admits the zero records other tar writers pad archives with.
        """
        at = self.offset
        while self._pos < self._end or self._refill():
            rest = self._view[self._pos : self._end]
            if not allow_zeros or rest.tobytes().strip(b"\0"):
                raise MalformedBundleError(f"{self._what} has bytes after the end of the tar (at byte {at})")
            self._pos = self._end
