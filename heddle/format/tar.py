"""The one tar dialect a bundle speaks: POSIX ustar, regular files only, written and read here.

Reading is done header by header from a stream, never through an extractor: the caller
decides what each entry may be and where its bytes go, so a link, a device or a name that
climbs is refused before anything is created for it.
"""

from __future__ import annotations

from collections.abc import Callable
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


def header(name: str, size: int, mode: int, mtime: int) -> bytes:
    """The header of a regular file, byte for byte as SPEC.md describes it."""
    split = split_name(name)
    if split is None:
        raise ValueError(f"{name!r} does not fit a ustar header")
    prefix, short = split
    # A wider number would not be cut: it would shift every later field of the header.
    if not (0 <= size <= MAX_SIZE and 0 <= mtime <= MAX_SIZE):
        raise ValueError(f"{name!r}: size {size} or mtime {mtime} does not fit a ustar header")
    block = bytearray(BLOCK)
    block[0 : len(short.encode())] = short.encode("utf-8")
    block[100:108] = _octal(mode, 8)
    block[108:116] = _octal(0, 8)
    block[116:124] = _octal(0, 8)
    block[124:136] = _octal(size, 12)
    block[136:148] = _octal(mtime, 12)
    block[148:156] = b" " * 8
    block[156:157] = REGULAR.encode()
    block[257:263] = b"ustar\0"
    block[263:265] = b"00"
    block[329:337] = _octal(0, 8)
    block[337:345] = _octal(0, 8)
    block[345 : 345 + len(prefix.encode())] = prefix.encode("utf-8")
    block[148:156] = format(sum(block), "o").rjust(6, "0").encode("ascii") + b"\0 "
    return bytes(block)


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


_ZERO_BLOCK = bytes(BLOCK)


class TarReader:
    """Walks a tar stream entry by entry; the caller consumes each entry's data in turn.

    Reads go through one buffer, so a run of small entries costs one call to the
    decompressor per megabyte rather than three per entry.
    """

    CHUNK = 1 << 20

    def __init__(self, raw: Readable, *, what: str, strict: bool = True) -> None:
        self._raw = raw
        self._what = what
        self._strict = strict
        self.offset = 0
        self._buffer = bytearray(self.CHUNK)
        self._view = memoryview(self._buffer)
        self._pos = 0
        self._end = 0

    def _refill(self) -> int:
        """Keep the unread bytes, read more after them; 0 at the end of the stream."""
        left = self._end - self._pos
        if left and self._pos:
            self._buffer[:left] = self._buffer[self._pos : self._end]
        self._pos, self._end = 0, left
        n = self._raw.readinto(self._view[left:])
        self._end += n
        return n

    def _take(self, n: int, during: str) -> memoryview:
        """Exactly `n` (at most CHUNK) contiguous bytes, valid until the next read."""
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

    def next_header(self) -> TarHeader | None:
        """The next entry's header, or None at the end-of-archive marker."""
        at = self.offset
        block = bytes(self._take(BLOCK, f"the header at byte {at}"))
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
