"""Caps a verifier enforces before it trusts sizes it has not yet seen.

Every cap is checked from the manifest or the zstd frame header, before the payload is
decompressed, so an archive that would blow past one is refused having cost a few reads.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# zstd's levels; 3 is zstd's own default and `heddle bundle --level`'s (heddle.settings reads these).
ZSTD_LEVEL, ZSTD_MIN_LEVEL, ZSTD_MAX_LEVEL = 3, 1, 22


@dataclass(frozen=True)
class Limits:
    max_manifest_bytes: int = 8 * MiB
    max_signatures_bytes: int = 64 * KiB
    max_signatures: int = 16
    max_files: int = 100_000
    max_file_bytes: int = 2 * GiB
    max_total_bytes: int = 4 * GiB
    max_depth: int = 32
    # Expanded bytes per compressed byte; only applies once the expanded size is past
    # `ratio_floor_bytes`, because small archives of headers compress far better than that.
    max_ratio: int = 1000
    ratio_floor_bytes: int = 64 * MiB

    def max_expanded_bytes(self, compressed_size: int) -> int:
        return max(self.ratio_floor_bytes, self.max_ratio * compressed_size)

    def max_content_bytes(self) -> int:
        """The most a bundle's tar stream may declare: payload, manifest, signatures, a header per file."""
        return self.max_total_bytes + self.max_manifest_bytes + self.max_signatures_bytes + (self.max_files + 4) * KiB

    def max_archive_bytes(self) -> int:
        """The largest .heddle file a bundle within these caps packs to: zstd stores at most its input,
        a 3-byte header per 128 KiB block, and at most 22 bytes of frame header and checksum. A pull
        refuses a larger file from its declared size, before downloading it."""
        content = self.max_content_bytes()
        return content + 3 * (content // (128 * KiB) + 1) + 22


DEFAULT_LIMITS = Limits()
