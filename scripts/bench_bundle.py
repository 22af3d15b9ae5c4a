#!/usr/bin/env python3
"""Benchmark sealing and opening a bundle against plain sha256+zstd of the same bytes.

    .venv/bin/python scripts/bench_bundle.py [--mib 100] [--keep DIR]

Builds a tree of mixed files (incompressible binaries, text, one large JSON-like file and
many small files), then measures, in this one run on this machine:

* pack: `heddle.bundle.pack` (hash, sign, tar, zstd, fsync, rename) against reading every
  file with sha256 and compressing the concatenation with the same zstd level;
* open: `open_bundle` into an empty cache (frame walk, trust, manifest, decompress, hash,
  write, seal, rename) against decompressing that baseline stream with sha256;
* the same cold open against `zstd -dc | tar -x` of the bundle, which writes the same files
  (on a disk where creating a file is slow, that cost dominates both);
* warm re-open of the cached digest (median of 20);
* size against `tar -cf - . | gzip -9` of the same tree.

Prints a markdown table; figures are ratios so they compare across machines.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1024 * 1024
WORDS = (
    "agent flow tool mount bundle seal verify trust digest manifest payload signature cache node edge "
    "input output schema model prompt branch plugin workspace sandbox run state event token stream"
).split()


def make_tree(root: Path, total_mib: int, seed: int = 7) -> tuple[int, int]:
    """Roughly total_mib MiB: 40% random binaries, 40% text, 15% one big JSON-ish file, 5% small files."""
    rng = random.Random(seed)
    budget = total_mib * MiB
    files = 0

    def text(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            out += (" ".join(rng.choice(WORDS) for _ in range(12)) + "\n").encode()
        return bytes(out[:n])

    (root / "bin").mkdir(parents=True)
    for i in range(int(budget * 0.40) // (2 * MiB)):
        (root / "bin" / f"blob{i:03}.bin").write_bytes(rng.randbytes(2 * MiB))
        files += 1
    for i in range(int(budget * 0.40) // (100 * 1024)):
        folder = root / "docs" / f"part{i % 16:02}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"doc{i:04}.md").write_bytes(text(100 * 1024))
        files += 1
    lines = [f'{{"id": {i}, "name": "{rng.choice(WORDS)}", "score": {rng.randint(0, 10**6)}}}' for i in range(10**6)]
    big = ("[\n" + ",\n".join(lines) + "\n]\n").encode()[: int(budget * 0.15)]
    (root / "data.json").write_bytes(big)
    files += 1
    small = root / "skills"
    for i in range(int(budget * 0.05) // 2048):
        folder = small / f"s{i % 64:02}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"note{i:05}.txt").write_bytes(text(2048))
        files += 1
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return size, files


def settle() -> None:
    """Flush dirty pages so one phase's writeback does not slow the next one's file creation."""
    os.sync()
    time.sleep(0.2)


def baseline(root: Path, level: int, work: Path) -> tuple[float, float]:
    import zstandard

    paths = sorted(p for p in root.rglob("*") if p.is_file())
    out = work / "baseline.zst"
    settle()
    t0 = time.perf_counter()
    with open(out, "wb") as fh:
        writer = zstandard.ZstdCompressor(level=level, write_checksum=True).stream_writer(fh, closefd=False)
        for path in paths:
            data = path.read_bytes()
            hashlib.sha256(data).digest()
            writer.write(data)
        writer.close()
    pack_s = time.perf_counter() - t0
    settle()
    t0 = time.perf_counter()
    digest = hashlib.sha256()
    with open(out, "rb") as fh:
        reader = zstandard.ZstdDecompressor().stream_reader(fh)
        while chunk := reader.read(MiB):
            digest.update(chunk)
    open_s = time.perf_counter() - t0
    return pack_s, open_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=100, help="size of the tree in MiB (default 100)")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it")
    args = parser.parse_args()

    from heddle.format.archive import ZSTD_LEVEL
    from heddle.format.cache import remove_tree
    from heddle.bundle.collect import PlanFile, collect_tree
    from heddle.format.keys import generate, load_public_key, load_signing_key
    from heddle.format.pack import PackPlan, pack
    from heddle.format.verify import open_bundle

    work = args.keep or Path(tempfile.mkdtemp(prefix="heddle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tree = work / "tree"
        size, count = make_tree(tree, args.mib)
        (tree / "flow.json").write_text("{}\n")
        keys = generate(work / "bench", None)
        signing, public = load_signing_key(keys.private_path), load_public_key(keys.public_path)
        collected = collect_tree(tree, "mounts/data", what="bench tree")
        collected.files.append(PlanFile("flow.json", tree / "flow.json", 0o644))
        plan = PackPlan(name="bench", flow="flow.json", files=collected.files)

        base_pack, base_open = baseline(tree, ZSTD_LEVEL, work)
        out = work / "bench.heddle"
        settle()
        t0 = time.perf_counter()
        result = pack(plan, out, signing_key=signing)
        pack_s = time.perf_counter() - t0

        # Cold opens and GNU tar extracting the same bundle, taken in turns into fresh
        # folders so both see the same disk state (this VM's file creation cost swings).
        cold, extracts = [], []
        for i in range(3):
            extract_dir = work / f"extract{i}"
            extract_dir.mkdir()
            settle()
            t0 = time.perf_counter()
            unzstd = subprocess.Popen(["zstd", "-dcq", str(out)], stdout=subprocess.PIPE)
            subprocess.run(["tar", "-C", str(extract_dir), "-xf", "-"], stdin=unzstd.stdout, check=True)
            unzstd.wait()
            extracts.append(time.perf_counter() - t0)
            cache = work / f"cache{i}"
            settle()
            t0 = time.perf_counter()
            opened = open_bundle(out, trusted_keys=[public], cache_root=cache)
            cold.append(time.perf_counter() - t0)
        open_s, extract_s = statistics.median(cold), statistics.median(extracts)
        warm = []
        for _ in range(20):
            t0 = time.perf_counter()
            again = open_bundle(out, trusted_keys=[public], cache_root=cache)
            warm.append(time.perf_counter() - t0)
            assert again.cached and again.root == opened.root
        warm_ms, warm_min_ms = statistics.median(warm) * 1000, min(warm) * 1000

        gz = work / "tree.tar.gz"
        with open(gz, "wb") as fh:
            tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["gzip", "-9"], stdin=tar.stdout, stdout=fh, check=True)
            tar.wait()
        gz_size = gz.stat().st_size

        print(f"Tree: {size / MiB:.1f} MiB in {count} files (random binaries, text, JSON, small notes); "
              f"zstd level {ZSTD_LEVEL}; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs.\n")
        print("| measure | heddle | baseline | ratio | aim |")
        print("|---|---:|---:|---:|---|")
        print(f"| pack (hash, sign, tar, zstd, fsync) | {pack_s:.2f} s | {base_pack:.2f} s sha256+zstd | "
              f"{pack_s / base_pack:.2f}x | |")
        print(f"| open, cold (verify, write, seal; median of 3) | {open_s:.2f} s | {base_open:.2f} s zstd -d + sha256 | "
              f"{open_s / base_open:.2f}x | within 1.5x |")
        print(f"| open, cold, against extracting it (median of 3) | {open_s:.2f} s | {extract_s:.2f} s zstd -dc \\| tar -x | "
              f"{open_s / extract_s:.2f}x | |")
        print(f"| open, warm (cached digest; median of 20, fastest) | {warm_ms:.1f} ms, {warm_min_ms:.1f} ms | | | under 50 ms |")
        print(f"| size | {result.size / MiB:.1f} MiB | {gz_size / MiB:.1f} MiB tar + gzip -9 | "
              f"{result.size / gz_size:.2f}x | |")
    finally:
        if args.keep is None:
            remove_tree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
