#!/usr/bin/env python3
"""Big bundles: packing, opening and their memory, each against its floor in the same run.

    .venv/bin/python scripts/bench_bundle.py [--quick] [--mib 100] [--big-mib 2048] [--write] [--keep DIR]

Builds a tree of mixed files in a temporary folder (random binaries, text, JSON, small notes;
--mib MiB, about 3,000 files at 100 MiB) and measures, floor and heddle taken by turns so that
a busy machine slows both alike:

* pack: `heddle.format.pack.pack` (hash, sign, tar, zstd on its worker threads, fsync, rename)
  against `tar -c | zstd -T0 -3` of the same tree (which does not fsync), and the sizes;
* each zstd level heddle could default to, packed once, against that same floor;
* cold open: `verify_bundle` into an empty cache (frame walk, trust, manifest, decompress, hash,
  write, seal, rename) against `zstd -dc | tar -x` of the bundle, and against `zstd -dc |
  sha256sum` (the figure issue 15 started from);
* warm open: re-opening the cached digest with its re-open proof;
* memory: the peak RSS of a process packing, then one opening, a second tree of --big-mib MiB
  (2 GiB; 256 MiB with --quick), beside a process that only imports the same modules.

Wall times are medians; the CPU column (user + system of every thread and child process) is the
steadier figure on a machine others share. Prints the markdown section docs/benchmarks.md holds
under "Bundles"; --write also puts it there, replacing that section only.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from heddle.format.pack import PackPlan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024
WORDS = ["agent", "flow", "tool", "mount", "bundle", "seal", "verify", "trust", "digest", "manifest", "payload",
         "signature", "cache", "node", "edge", "input", "output", "schema", "model", "prompt", "branch", "plugin",
         "workspace", "sandbox", "run", "state", "event", "token", "stream"]
T = TypeVar("T")
SMALL_CAP = 3000  # small notes at most: past this, their share of the tree goes to text files


# --------------------------------------------------------------------------------------- the tree


def make_tree(root: Path, total_mib: int, seed: int = 7) -> tuple[int, int]:
    """About total_mib MiB: 40% random 2 MiB binaries, 40% 100 KiB text files, 15% JSON lines
    in files of at most 16 MiB, 5% 2 KiB notes (at most SMALL_CAP). Text comes from a pool
    larger than any zstd window heddle uses, sliced at random offsets, so it is quick to make
    and compresses as text does. (Bytes, files.)"""
    rng = random.Random(seed)
    budget = total_mib * MiB
    lines: list[str] = []
    line: list[str] = []
    for word in rng.choices(WORDS, k=(8 * MiB) // 6):
        line.append(word)
        if len(line) == 12:
            lines.append(" ".join(line))
            line = []
    pool = ("\n".join(lines) + "\n").encode()
    records = "".join(f'{{"id": {i}, "name": "{rng.choice(WORDS)}", "score": {rng.randint(0, 10**6)}}},\n'
                      for i in range(150_000)).encode()
    files = 0

    def write(path: Path, data: bytes) -> None:
        nonlocal files
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files += 1

    def sliced(source: bytes, n: int) -> bytes:
        at = rng.randrange(0, len(source) - n) if len(source) > n else 0
        return source[at : at + n]

    for i in range(int(budget * 0.40) // (2 * MiB)):
        write(root / "bin" / f"blob{i:04}.bin", rng.randbytes(2 * MiB))
    small = min(int(budget * 0.05) // 2048, SMALL_CAP)
    text_bytes = int(budget * 0.40) + int(budget * 0.05) - small * 2048
    for i in range(text_bytes // (100 * 1024)):
        write(root / "docs" / f"part{i % 16:02}" / f"doc{i:05}.md", sliced(pool, 100 * 1024))
    left, i = int(budget * 0.15), 0
    while left > 0:
        n = min(left, 16 * MiB)
        chunk = b"".join(sliced(records, min(n, len(records) - 1)) for _ in range(n // len(records) + 1))[:n]
        write(root / "data" / f"table{i:02}.json", b"[\n" + chunk)
        left, i = left - n, i + 1
    for i in range(small):
        write(root / "skills" / f"s{i % 64:02}" / f"note{i:05}.txt", sliced(pool, 2048))
    (root / "flow.json").write_text("{}\n")
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return size, files + 1


def plan_of(tree: Path) -> PackPlan:
    from heddle.bundle.collect import collect_tree
    from heddle.format.pack import PackPlan, PlanFile

    collected = collect_tree(tree, "mounts/data", what="bench tree")
    collected.files.append(PlanFile("flow.json", tree / "flow.json", 0o644))
    return PackPlan(name="bench", flow="flow.json", files=collected.files)


# ---------------------------------------------------------------------------------- measurements


def settle() -> None:
    """Flush dirty pages so one phase's writeback does not slow the next one's file creation."""
    os.sync()
    time.sleep(0.2)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Timing:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def shell(command: str, timing: Timing) -> None:
    """Run a shell pipeline, adding its wall and CPU time (its processes') to `timing`."""
    cpu, started = _children_cpu(), time.perf_counter()
    subprocess.run(["sh", "-c", f"set -e; {command}"], check=True)
    timing.wall.append(time.perf_counter() - started)
    timing.cpu.append(_children_cpu() - cpu)


class Phases:
    """A Progress that notes when each bar starts and finishes: the passes of a pack or an open."""

    def __init__(self) -> None:
        self.spans: dict[str, list[float]] = {}
        self._label = ""
        self._at = 0.0

    def start(self, total: int, label: str) -> None:
        self._label, self._at = label.split()[0], time.perf_counter()

    def advance(self, n: int) -> None:
        pass

    def finish(self) -> None:
        self.spans.setdefault(self._label, []).append(time.perf_counter() - self._at)

    def median(self, label: str) -> float:
        return statistics.median(self.spans.get(label) or [0.0])


def in_process(call: Callable[[], T], timing: Timing) -> T:
    cpu, started = time.process_time(), time.perf_counter()
    result = call()
    timing.wall.append(time.perf_counter() - started)
    timing.cpu.append(time.process_time() - cpu)
    return result


_CHILD = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from heddle.bundle.collect import PlanFile, collect_tree
from heddle.format.pack import PackPlan, pack
from heddle.format.verify import verify_bundle
what, a, b = sys.argv[2:5]
if what == "pack":
    tree = Path(a)
    collected = collect_tree(tree, "mounts/data", what="bench tree")
    collected.files.append(PlanFile("flow.json", tree / "flow.json", 0o644))
    pack(PackPlan(name="big", flow="flow.json", files=collected.files), Path(b))
elif what == "open":
    verify_bundle(Path(a), trusted_keys=[], allow_unsigned=True, cache_root=Path(b))
# Its own peak: the rusage a parent reads also counts the parent's pages the child shared before exec.
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def child_rss(*args: str) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of a fresh Python process doing one thing of _CHILD."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), *args], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the {args[0]} process failed: {proc.stderr.strip()[-500:]}")
    return int(proc.stdout.split()[-1]) / 1024, time.perf_counter() - started


# --------------------------------------------------------------------------------------- the run


def read_head_of(path: Path) -> None:
    """What a warm open does before the manifest checks: the frame walk and the head entries."""
    from heddle.format.archive import read_head
    from heddle.format.limits import DEFAULT_LIMITS
    from heddle.format.verify import open_file

    with open_file(path) as fh:
        read_head(fh, what=str(path), limits=DEFAULT_LIMITS)


def table(rows: list[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(row) + " |" for row in rows]


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, a 256 MiB memory tree, levels 1 and 3")
    parser.add_argument("--mib", type=int, default=100, help="size of the timing tree in MiB (default 100)")
    parser.add_argument("--big-mib", type=int, help="size of the memory tree in MiB (default 2048; 256 with --quick)")
    parser.add_argument("--write", action="store_true", help="also put the section into docs/benchmarks.md")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it")
    args = parser.parse_args()
    rounds = 2 if args.quick else 3
    warm_runs = 10 if args.quick else 20
    levels = (1, 3) if args.quick else (1, 3, 6, 9)
    big_mib = args.big_mib or (256 if args.quick else 2048)

    from heddle.format.archive import ZSTD_LEVEL, compression_threads
    from heddle.format.cache import Cache, remove_tree
    from heddle.format.keys import generate, load_public_key, load_signing_key
    from heddle.format.manifest import Manifest
    from heddle.format.pack import pack
    from heddle.format.verify import collector_paused, verify_bundle, peek, reprove

    work = args.keep or Path(tempfile.mkdtemp(prefix="heddle-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        tree = work / "tree"
        size, count = make_tree(tree, args.mib)
        keys = generate(work / "bench", None)
        signing, public = load_signing_key(keys.private_path), load_public_key(keys.public_path)
        plan = plan_of(tree)
        out, floor_out = work / "bench.heddle", work / "floor.tar.zst"

        floor_pack, heddle_pack = Timing(), Timing()
        phases = Phases()
        for _ in range(rounds):
            settle()
            shell(f"tar -C {tree} -cf - . | zstd -T0 -3 -q -f -o {floor_out}", floor_pack)
            settle()
            result = in_process(lambda: pack(plan, out, signing_key=signing, progress=phases), heddle_pack)
        floor_size = floor_out.stat().st_size
        hashing, compressing = phases.median("hashing"), phases.median("packing")

        by_level: dict[int, tuple[float, int]] = {}
        for level in levels:
            timing = Timing()
            settle()
            packed = in_process(functools.partial(pack, plan, work / "level.heddle", level=level), timing)
            by_level[level] = (timing.median, packed.size)

        floor_extract, floor_hash, cold = Timing(), Timing(), Timing()
        walked = Phases()
        for i in range(rounds):
            extract = work / f"extract{i}"
            extract.mkdir()
            settle()
            shell(f"zstd -dcq {out} | tar -C {extract} -xf -", floor_extract)
            settle()
            shell(f"zstd -dcq {out} | sha256sum > /dev/null", floor_hash)
            settle()
            opened = in_process(functools.partial(verify_bundle, out, trusted_keys=[public],
                                                  cache_root=work / f"cache{i}", progress=walked), cold)
            remove_tree(extract)
        cache = work / f"cache{rounds - 1}"
        warm = Timing()
        for _ in range(warm_runs):
            again = in_process(lambda: verify_bundle(out, trusted_keys=[public], cache_root=cache), warm)
            assert again.cached and again.root == opened.root, (again.repaired, again.root, opened.root)
        seen = peek(out)
        head, parse, proof = Timing(), Timing(), Timing()
        manifest = Manifest.from_bytes(seen.manifest_bytes)
        for _ in range(warm_runs):
            in_process(functools.partial(read_head_of, out), head)
            # Each part as the open runs it: with the cyclic collector held off (verify.collector_paused).
            with collector_paused():
                in_process(lambda: Manifest.from_bytes(seen.manifest_bytes), parse)
            with collector_paused():
                in_process(lambda: reprove(Cache(cache), opened.digest, manifest), proof)

        big_tree = work / "big"
        big_size, big_count = make_tree(big_tree, big_mib, seed=11)
        settle()
        base_rss, _ = child_rss("imports", "", "")
        pack_rss, big_pack_s = child_rss("pack", str(big_tree), str(work / "big.heddle"))
        remove_tree(big_tree)
        settle()
        open_rss, big_open_s = child_rss("open", str(work / "big.heddle"), str(work / "big-cache"))
        big_bundle = (work / "big.heddle").stat().st_size

        threads = compression_threads()
        q = " --quick" if args.quick else ""
        intro = (f"Produced by `.venv/bin/python scripts/bench_bundle.py{q}` (run by `scripts/bench{q}`) on "
                 f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}: a tree of {mib(size)} in {count} files "
                 f"(random binaries, text, JSON, small notes), zstd level {ZSTD_LEVEL} on {threads} worker "
                 f"thread(s); {rounds} rounds of each figure and its floor, taken by turns (medians). CPU is the "
                 "user + system time of every thread and child process: the steadier figure on a shared machine.")
        payload_s = walked.median("verifying")
        rows: list[tuple[str, ...]] = [
            ("measure", "heddle", "floor", "ratio", "CPU ratio", "aim"),
            ("---", "---:", "---:", "---:", "---:", "---"),
            ("pack (hash, sign, tar, zstd, fsync)", f"{heddle_pack.median:.2f} s",
             f"{floor_pack.median:.2f} s `tar -c \\| zstd -T0 -3` (no fsync)",
             ratio(heddle_pack.median, floor_pack.median), ratio(heddle_pack.cpu_median, floor_pack.cpu_median),
             "within 1.5x"),
            ("of which: hashing pass, writing pass (tar, zstd, fsync, rename)",
             f"{hashing:.2f} s, {compressing:.2f} s", "", "", "", ""),
            ("size", mib(result.size), mib(floor_size), ratio(result.size, floor_size), "", "within 1.1x"),
            ("open, cold (verify, write, seal)", f"{cold.median:.2f} s",
             f"{floor_extract.median:.2f} s `zstd -dc \\| tar -x`", ratio(cold.median, floor_extract.median),
             ratio(cold.cpu_median, floor_extract.cpu_median), "within 1.3x"),
            ("open, cold, against hashing alone", f"{cold.median:.2f} s",
             f"{floor_hash.median:.2f} s `zstd -dc \\| sha256sum`", ratio(cold.median, floor_hash.median),
             ratio(cold.cpu_median, floor_hash.cpu_median), "(was 1.86x)"),
            ("of which: the payload walk (decompress, check, hash; the writes overlap it and may end later)",
             f"{payload_s:.2f} s", "", "", "", ""),
            (f"open, warm ({count} files; median, fastest of {warm_runs})",
             f"{warm.median * 1000:.1f} ms, {min(warm.wall) * 1000:.1f} ms", "", "", "", "under 50 ms"),
            ("of which: frame walk and head, manifest checks, re-open proof",
             f"{head.median * 1000:.1f} ms, {parse.median * 1000:.1f} ms, {proof.median * 1000:.1f} ms",
             "", "", "", ""),
            (f"peak RSS, packing {mib(big_size)} in {big_count} files ({big_pack_s:.1f} s)", f"{pack_rss:.0f} MiB",
             f"{base_rss:.0f} MiB importing alone", "", "", "under 150 MiB"),
            (f"peak RSS, opening it ({mib(big_bundle)}, {big_open_s:.1f} s)", f"{open_rss:.0f} MiB",
             f"{base_rss:.0f} MiB importing alone", "", "", "under 150 MiB"),
        ]
        levels_rows: list[tuple[str, ...]] = [("level", "pack", "ratio", "size", "ratio"),
                                              ("---:", "---:", "---:", "---:", "---:")]
        for level, (seconds, packed_size) in by_level.items():
            levels_rows.append((f"{level}{' (default)' if level == ZSTD_LEVEL else ''}", f"{seconds:.2f} s",
                                ratio(seconds, floor_pack.median), mib(packed_size), ratio(packed_size, floor_size)))
        levels_intro = "Each level (`heddle bundle --level N`), packed once, against the pack floor above:"
        lines = [intro, "", *table(rows), "", levels_intro, "", *table(levels_rows)]
        notes = []
        if heddle_pack.median > 1.5 * floor_pack.median:
            notes.append(
                f"* pack misses its aim: of its {heddle_pack.median:.2f} s, the hashing pass took {hashing:.2f} s and "
                f"the writing pass {compressing:.2f} s ({ratio(compressing, floor_pack.median)} the floor alone, "
                "fsync included). Every file is hashed before a byte is compressed: the manifest, which holds every "
                "hash, is the archive's first entry and the frame's checksum runs over it first: small files are "
                "kept from the hashing read (up to 32 MiB) and written from it, a bigger one is read again, mostly "
                f"from the page cache. The hashing pass runs on {threads} thread(s) at what sha256 and the page cache "
                f"give; the CPU ratio ({ratio(heddle_pack.cpu_median, floor_pack.cpu_median)}) is the work both "
                "passes add.")
        if cold.median > 1.3 * floor_extract.median:
            notes.append(
                f"* cold open misses its aim: the payload walk took {payload_s:.2f} s of {cold.median:.2f} s; the rest "
                "is file creation finishing on the writer thread and sealing (the disk's share, which `tar -x` "
                "pays too).")
        if warm.median > 0.050:
            notes.append(
                f"* warm open misses its aim on the median ({warm.median * 1000:.1f} ms; fastest "
                f"{min(warm.wall) * 1000:.1f} ms): every open walks the frame's block headers (one read per "
                f"128 KiB block; {head.median * 1000:.1f} ms with the head), parses and checks the whole manifest "
                f"(strict JSON, canonical re-encoding, path and collision rules; {parse.median * 1000:.1f} ms) and "
                f"re-proves the cached tree (its snapshot read and checked, a stat of every file, a hash of every "
                f"program; {proof.median * 1000:.1f} ms), as SPEC.md section 7 requires of each open. The stats "
                "are the kernel's share (some 3 us a file here); the rest is json's parse of the manifest and the "
                "snapshot and the passes of C over their columns.")
        if notes:
            lines += ["", "Where an aim is missed, why:", "", *notes]
        text = "\n".join(lines)
        print(text)
        if args.write:
            write_section(ROOT / "docs" / "benchmarks.md", "Bundles", text)
    finally:
        if args.keep is None:
            remove_tree(work)
    return 0


def write_section(doc: Path, title: str, body: str) -> None:
    """Replace the body of `## title` in `doc` (up to the next `## `), leaving the rest as it is."""
    text = doc.read_text()
    head = f"## {title}\n"
    start = text.find(head)
    if start < 0:
        doc.write_text(text.rstrip("\n") + f"\n\n{head}\n{body}\n")
        return
    end = text.find("\n## ", start + len(head))
    tail = text[end + 1 :] if end >= 0 else ""
    doc.write_text(text[:start] + f"{head}\n{body}\n\n" + tail)


if __name__ == "__main__":
    sys.exit(main())
