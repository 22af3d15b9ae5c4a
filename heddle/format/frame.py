"""The zstd container: exactly one frame, with its content size and checksum, and nothing after.

The frame is walked block header by block header before anything is decompressed. That
finds its end without trusting the decompressor to stop there, so a second frame or
trailing bytes are refused up front, and the declared content size is known (and capped)
before a byte is inflated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from heddle.format.errors import BundleLimitError, MalformedBundleError
from heddle.format.limits import Limits
from heddle.safeparse import open_regular

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
_SKIPPABLE_LOW, _SKIPPABLE_HIGH = 0x184D2A50, 0x184D2A5F


@dataclass(frozen=True)
class FrameInfo:
    content_size: int
    end: int
    file_size: int


def starts_like_bundle(path: Path) -> bool:
    """True when the regular file at `path` starts with a bundle's magic number (zstd, or gzip for
    format 1). OSErrors, `NotRegularFileError` among them, pass through."""
    fd = open_regular(path)
    try:
        head = os.read(fd, len(ZSTD_MAGIC))
    finally:
        os.close(fd)
    return head == ZSTD_MAGIC or head[: len(GZIP_MAGIC)] == GZIP_MAGIC


def _pread(fd: int, n: int, at: int, what: str) -> bytes:
    data = os.pread(fd, n, at)
    if len(data) != n:
        raise MalformedBundleError(f"{what} is truncated (the zstd frame ends early at byte {at})")
    return data


def walk_frame(fd: int, file_size: int, *, what: str, limits: Limits) -> FrameInfo:
    """Check the frame layout of the file open at `fd` and return its declared content size."""
    magic = _pread(fd, 4, 0, what)
    if magic != ZSTD_MAGIC:
        number = int.from_bytes(magic, "little")
        if _SKIPPABLE_LOW <= number <= _SKIPPABLE_HIGH:
            raise MalformedBundleError(f"{what} starts with a skippable zstd frame; a bundle is one data frame")
        raise MalformedBundleError(f"{what} is not a heddle bundle (it does not start with a zstd frame)")
    descriptor = _pread(fd, 1, 4, what)[0]
    fcs_flag = descriptor >> 6
    single_segment = (descriptor >> 5) & 1
    if (descriptor >> 3) & 1:
        raise MalformedBundleError(f"{what}: the zstd frame header sets a reserved bit")
    if not (descriptor >> 2) & 1:
        raise MalformedBundleError(f"{what}: the zstd frame has no content checksum; a bundle frame carries one")
    if descriptor & 3:
        raise MalformedBundleError(f"{what}: the zstd frame needs a dictionary; a bundle frame does not")
    fcs_bytes = (0 if not single_segment else 1, 2, 4, 8)[fcs_flag]
    if fcs_bytes == 0:
        raise MalformedBundleError(f"{what}: the zstd frame does not declare its content size")
    at = 5 + (0 if single_segment else 1)
    content_size = int.from_bytes(_pread(fd, fcs_bytes, at, what), "little")
    if fcs_bytes == 2:
        content_size += 256
    at += fcs_bytes
    ceiling = limits.max_content_bytes()
    if content_size > ceiling:
        raise BundleLimitError(
            f"{what} declares {content_size} uncompressed bytes, over the cap of {ceiling}"
        )
    while True:
        block = int.from_bytes(_pread(fd, 3, at, what), "little")
        last, kind, size = block & 1, (block >> 1) & 3, block >> 3
        if kind == 3:
            raise MalformedBundleError(f"{what}: the zstd frame has a reserved block type at byte {at}")
        at += 3 + (1 if kind == 1 else size)
        if at > file_size:
            raise MalformedBundleError(f"{what} is truncated (a zstd block runs past the end of the file)")
        if last:
            break
    at += 4
    if at > file_size:
        raise MalformedBundleError(f"{what} is truncated (the zstd checksum is missing)")
    if at != file_size:
        follows = "a second zstd frame" if os.pread(fd, 4, at) == ZSTD_MAGIC else "trailing bytes"
        raise MalformedBundleError(
            f"{what} has {file_size - at} bytes after its zstd frame ({follows}); a bundle is exactly one frame"
        )
    return FrameInfo(content_size=content_size, end=at, file_size=file_size)
