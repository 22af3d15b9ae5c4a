"""The benchmarks behind docs/benchmarks.md. Every figure is a ratio to a baseline measured in the
same run on the same machine, so the numbers travel between machines better than seconds do."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HEDDLE = str(BIN / "heddle")
sys.path.insert(0, str(ROOT))


def median_time(argv: list[str], runs: int, *, env=None, stdin: bytes | None = None) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_engine(runs: int) -> list[tuple[str, str, str]]:
    from tests.support.flows import FlowDoc, server_tool, write_tool

    rows = []
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    bare_python = median_time([sys.executable, "-c", "pass"], runs)
    help_time = median_time([HEDDLE, "--help"], runs, env=env)
    rows.append(("`heddle --help`, median wall time", f"{help_time * 1000:.0f} ms",
                 f"{help_time / bare_python:.1f}x a bare `python -c pass` ({bare_python * 1000:.0f} ms); aim < 150 ms"))
    imp = subprocess.run([sys.executable, "-X", "importtime", "-c", "import heddle.cli"], capture_output=True,
                         text=True, env=env).stderr.splitlines()
    total_us = int(imp[-1].split("|")[1]) if imp else 0
    rows.append(("import time of `heddle.cli`", f"{total_us / 1000:.0f} ms", "python -X importtime, cumulative"))

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        tools = tmp_path / "tools"
        for name in ("one", "two", "three"):
            write_tool(tools, f"{name}.py", f"out = {{'{name}': args.get('n', 0) + 1}}")
        f = FlowDoc("three-tools")
        s = f.start([{"title": "n", "type": "integer"}])
        nodes = [f.tool_node(n, server_tool(n)) for n in ("one", "two", "three")]
        e = f.end(["three"])
        for a, b in zip([s, *nodes], [*nodes, e]):
            f.control(a, b)
        flow = f.write(tmp_path / "flow.json")
        run = median_time([HEDDLE, "run", str(flow), "--tools-dir", str(tools), "--input", '{"n": 1}'], runs, env=env)

        def bare() -> None:
            for name in ("one", "two", "three"):
                subprocess.run([str(tools / f"{name}.py")], input=b'{"n": 1}', stdout=subprocess.DEVNULL,
                               env=env, check=True)

        times = []
        for _ in range(runs):
            started = time.perf_counter()
            bare()
            times.append(time.perf_counter() - started)
        baseline = statistics.median(times)
        rows.append(("3-ToolNode `heddle run`, median wall time", f"{run * 1000:.0f} ms",
                     f"{run / baseline:.2f}x the same three tools run as bare subprocesses ({baseline * 1000:.0f} ms)"))
    return rows


def table(rows) -> str:
    out = ["| measure | value | ratio / note |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)


def run_part(script: str, quick: bool) -> str | None:
    path = ROOT / "scripts" / script
    if not path.exists():
        return None
    args = ["--quick"] if quick and "--quick" in path.read_text() else []
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"`{script}` failed: {proc.stderr.strip()[-500:]}"
    return proc.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args()
    runs = 5 if args.quick else 15
    sections = [("Engine", table(bench_engine(runs)))]
    for title, script in (("Workspaces and safe mode", "bench_workspace.py"), ("Bundles", "bench_bundle.py"),
                          ("Plugins", "bench_plugins.py")):
        text = run_part(script, args.quick)
        if text:
            sections.append((title, text))
    cmd = "scripts/bench" + (" --quick" if args.quick else "")
    doc = [
        "# Benchmarks",
        "",
        f"Produced by `{cmd}` on {platform.machine()} / Python {platform.python_version()} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. Every figure is a ratio to a baseline "
        "measured in the same run; absolute times are shown only for context.",
        "",
    ]
    for title, text in sections:
        doc += [f"## {title}", "", text, ""]
    load = ROOT / "docs" / "load.md"
    if load.exists():
        doc += ["## Server load (`scripts/load`)", "", load.read_text().strip(), ""]
    args.out.write_text("\n".join(doc))
    print("\n".join(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
