"""Bodies that are small on the wire and huge once decoded, for the caps on decoded bytes."""

from __future__ import annotations

_BLOCK = 128 * 1024  # the largest zstd block


def zstd_bomb(size: int) -> bytes:
    """A zstd frame of `size` zero bytes (a multiple of 128 KiB) made of RLE blocks: 4 bytes a block,
    so 1 GiB is 32 KiB, written at once rather than compressed."""
    count = size // _BLOCK
    assert count * _BLOCK == size and count > 0
    block = (_BLOCK << 3) | (1 << 1)  # RLE, not last
    body = (block.to_bytes(3, "little") + b"\0") * (count - 1) + (block | 1).to_bytes(3, "little") + b"\0"
    # Magic; no content size, not single-segment; a 128 KiB window (exponent 7).
    return b"\x28\xb5\x2f\xfd" + b"\x00" + bytes([7 << 3]) + body
