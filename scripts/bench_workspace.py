#!/usr/bin/env python3
"""Benchmark workspaces: the per-call overhead of --safe and the speed of mount copies.

    .venv/bin/python scripts/bench_workspace.py [--calls 60] [--files 2000] [--file-kib 8]

Prints one markdown table. Tool calls run exactly as the engine runs them (confine, then a
subprocess in the workspace); copies are timed against `cp -r` of the same tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from heddle.workspace import (  # noqa: E402
    SandboxPolicy,
    WorkspaceOptions,
    Workspaces,
    check_policy,
    confine,
    parse_mount,
)
from heddle.workspace.workspace import Workspace

TOOL = "#!/bin/sh\ncat >/dev/null\necho '{}'\n"


def median_ms(fn: Callable[[], None], repeat: int) -> float:
    fn()  # warm the page cache and the interpreter's imports
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def bench_calls(root: Path, calls: int) -> list[tuple[str, str, str]]:
    tools_dir = root / "tools"
    tools_dir.mkdir()
    tool = tools_dir / "noop"
    tool.write_text(TOOL)
    tool.chmod(0o755)
    spaces = Workspaces(WorkspaceOptions(), {"noop": tool}, tools_dir=tools_dir, warn=print)
    spaces.check()
    plain, safe = SandboxPolicy(), SandboxPolicy(safe=True)
    check_policy(safe, explicitly_set=[])

    def call(policy: SandboxPolicy) -> Callable[[], None]:
        def run() -> None:
            argv, env = confine(
                policy, [str(tool)], workspace=ws, tools_dir=tools_dir, env=ws.env(os.environ)
            )
            subprocess.run(argv, input=b"{}", env=env, cwd=ws.root, capture_output=True, check=True)

        return run

    with spaces.open("bench") as ws:
        plain_ms = median_ms(call(plain), calls)
        safe_ms = median_ms(call(safe), calls)
        # As the engine makes them (heddle.tools.process.run_process, on an event loop): --safe alone, then
        # with an egress list, the proxy's listener made in the call's namespace (tool calls) or a relay
        # started in the sandbox by a Python interpreter of its own (MCP servers and plugins, once per
        # process). Timed in turns, call by call, so that a machine busy with other work weighs on each alike;
        # the cost is the median of the differences of each turn.
        engine_ms, (egress_ms, inside_ms), (over_ms, inside_over_ms), cpu = paired_ms(
            egress_call(safe, tool, tools_dir, ws, None),
            [egress_call(safe, tool, tools_dir, ws, True), egress_call(safe, tool, tools_dir, ws, False)], calls)
    return [
        ("tool call, plain (median)", f"{plain_ms:.2f} ms", "1.00x"),
        ("tool call, --safe (median)", f"{safe_ms:.2f} ms", f"{safe_ms / plain_ms:.2f}x"),
        ("--safe overhead per call", f"{safe_ms - plain_ms:.2f} ms", ""),
        ("tool call, --safe, as the engine runs it (median)", f"{engine_ms:.2f} ms", f"{engine_ms / plain_ms:.2f}x"),
        ("tool call, --safe with an egress list (median)", f"{egress_ms:.2f} ms",
         f"{egress_ms / engine_ms:.2f}x of --safe"),
        ("egress enforcement per call, over --safe in the same turns (median; aim: 5 ms)", f"{over_ms:.2f} ms", ""),
        ("the same, relay started in the sandbox (MCP servers, plugins: once per process)",
         f"{inside_over_ms:.2f} ms", f"{inside_ms / engine_ms:.2f}x of --safe"),
        ("CPU per call, every process of it: --safe, as the engine runs it", f"{cpu[0]:.2f} ms", ""),
        ("CPU per call: --safe with an egress list", f"{cpu[1]:.2f} ms", f"+{cpu[1] - cpu[0]:.2f} ms"),
    ]


def paired_ms(base: Callable[[], None], others: list[Callable[[], None]], repeat: int
              ) -> tuple[float, list[float], list[float], list[float]]:
    """Medians of `base` and of each of `others`, run in turns; the median of each one's difference from
    `base` in the same turn; and the CPU time per call of `base` and of each of `others` (this process's,
    its children's, and that of the processes it keeps, the reaper server and its forks)."""
    for fn in (base, *others):
        fn()  # warm
    times: list[list[float]] = [[] for _ in range(len(others) + 1)]
    cpu = [0.0] * (len(others) + 1)
    for _ in range(repeat):
        for i, fn in enumerate((base, *others)):
            used = tree_cpu()
            started = time.perf_counter()
            fn()
            times[i].append((time.perf_counter() - started) * 1000)
            cpu[i] += tree_cpu() - used
    over = [statistics.median(t - b for t, b in zip(own, times[0], strict=True)) for own in times[1:]]
    return (statistics.median(times[0]), [statistics.median(own) for own in times[1:]], over,
            [seconds * 1000 / repeat for seconds in cpu])


def tree_cpu() -> float:
    """Seconds of CPU used by this process, its children it has collected, and every process below it still
    running (with those they have collected)."""
    mine = os.times()
    total = mine.user + mine.system + mine.children_user + mine.children_system
    tick = os.sysconf("SC_CLK_TCK")
    below = [os.getpid()]
    while below:
        pid = below.pop()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                    below.extend(int(child) for child in f.read().split())
            if pid == os.getpid():
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        # After the name: state, ppid, ..., then utime (the line's 14th field), stime, cutime, cstime.
        total += sum(int(x) for x in fields[11:15]) / tick
    return total


def egress_call(policy: SandboxPolicy, tool: Path, tools_dir: Path, ws: Workspace,
                runner: bool | None) -> Callable[[], None]:
    """A call as the engine makes it (on a loop, here a thread of its own): without an egress list (`runner`
    None), or with one, the call's proxy opened and the sandbox in a network namespace of its own, the proxy
    accepting on a listener made there (`runner`) or reached through a relay started before the tool."""
    import asyncio
    import contextlib
    import threading

    from heddle.egress import EgressPolicy, Rule
    from heddle.tools.process import run_process
    from heddle.workspace.egress_proxy import EgressCall, guarded

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    egress = EgressPolicy({"noop": (Rule("example.com"),)})

    def run() -> None:
        async def one() -> None:
            guard: contextlib.AbstractAsyncContextManager[EgressCall | None] = contextlib.nullcontext()
            if runner is not None:
                guard = guarded(egress, "noop", lambda refusal: None, runner=runner)
            async with guard as call:
                argv, env = confine(policy, [str(tool)], workspace=ws, tools_dir=tools_dir, env=ws.env(os.environ),
                                    egress=call)
                done = await run_process("noop", argv, b"{}", cwd=ws.root, env=env, sandboxed=True,
                                         netns=call.runner if call is not None else None)
                assert done.returncode == 0, done.stderr

        asyncio.run_coroutine_threadsafe(one(), loop).result()

    return run


def make_tree(root: Path, files: int, file_kib: int) -> int:
    payload = os.urandom(file_kib * 1024)
    per_dir = 100
    for i in range(files):
        folder = root / f"d{i // per_dir:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.bin").write_bytes(payload)
    return files * len(payload)


def bench_copies(root: Path, files: int, file_kib: int, repeat: int) -> list[tuple[str, str, str]]:
    tree = root / "tree"
    size = make_tree(tree, files, file_kib)
    mib = size / 2**20
    scratch = root / "scratch"
    scratch.mkdir()
    counter = iter(range(1_000_000))

    def cp_r() -> None:
        target = scratch / f"cp{next(counter)}"
        subprocess.run(["cp", "-r", str(tree), str(target)], check=True)
        shutil.rmtree(target)

    def workspace(mode: str) -> Callable[[], None]:
        spaces = Workspaces(
            WorkspaceOptions(
                mounts=(parse_mount(f"{tree}:tree:{mode}"),),
                max_entries=files * 2 + 100,
                max_bytes=size * 2,
            ),
            {},
            tools_dir=None,
            warn=print,
        )
        spaces.check()

        def run() -> None:
            with spaces.open("bench"):
                pass

        return run

    rows = []
    cp_ms = median_ms(cp_r, repeat)
    rows.append(("`cp -r` + remove", f"{cp_ms:.1f} ms ({mib / cp_ms * 1000:.0f} MiB/s)", "1.00x"))
    for mode, label in (("ro", "ro mount: open + close"), ("rw", "rw mount: open + close")):
        ms = median_ms(workspace(mode), repeat)
        rows.append((label, f"{ms:.1f} ms ({mib / ms * 1000:.0f} MiB/s)", f"{ms / cp_ms:.2f}x"))
    rows.insert(0, ("mount tree", f"{files} files, {mib:.1f} MiB", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60, help="tool calls per variant")
    parser.add_argument("--files", type=int, default=2000, help="files in the mount tree")
    parser.add_argument("--file-kib", type=int, default=8, help="size of each file")
    parser.add_argument("--repeat", type=int, default=7, help="copies timed per variant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="heddle-bench-") as tmp:
        root = Path(tmp)
        rows = bench_calls(root, args.calls)
        rows += bench_copies(root, args.files, args.file_kib, args.repeat)
    print("| workspace benchmark | time | ratio |")
    print("|---|---:|---:|")
    for name, value, ratio in rows:
        print(f"| {name} | {value} | {ratio} |")
    print()
    print(EGRESS_NOTE)


EGRESS_NOTE = """\
Egress enforcement per tool call: the call's proxy (served on heddle's loop), and the --safe sandbox with
a network namespace added (bubblewrap `--unshare-net`), which reports its namespaces and holds the tool;
a fork of the reaper server, made while bubblewrap starts, enters the sandbox's user and network
namespaces, makes the socket listening on 127.0.0.1:3128 there, hands it to heddle, whose proxy accepts
on it directly, lets the tool start and ends. No process of the call's own runs beside the tool (the
per-call reaper, its relay and the relay's fork per connection, which a call cost before, are gone): what
is left is that short fork (about 1.5 ms of CPU, most of it copy-on-write faults of a forked Python), the
namespace's making and unmaking in the kernel, and four short messages. Sharing one user namespace among
calls would spare the fork, but calls would then share the kernel's user keyrings, which per-call
sandboxes keep apart. The relay the sandbox starts itself (a Python interpreter, as MCP servers and
plugins are given once per process) costs several times that per call. Timings are wall clock on a
machine that may be busy with other work; the egress cost is the median of the differences of calls made
in turns with --safe ones, and the CPU rows count every process of a call (heddle, bubblewrap, the tool,
the fork that makes the listener)."""


if __name__ == "__main__":
    main()
