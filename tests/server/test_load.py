"""`scripts/load` (scripts/load.py): bounded runs against a server it starts, and its checks."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from tests.server.flows import ECHO, tool_chain, write_tools
from tests.support.cli import env_with

LOAD = Path(__file__).resolve().parents[2] / "scripts" / "load.py"


def load(*args) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(LOAD), *[str(a) for a in args]],
                          capture_output=True, text=True, timeout=300, env=env_with(), stdin=subprocess.DEVNULL,
                          check=False)


def test_load_reports_a_table_and_finds_nothing_left(tmp_path):
    tools = write_tools(tmp_path / "tools", {"a": ECHO, "b": ECHO, "c": ECHO})
    flow = tool_chain("three", ["a", "b", "c"]).write(tmp_path / "three.json")
    # Four callers start at once on two slots, so the refusals come in the first round: four runs
    # show them as well as more would (each run costs the server ~0.15 s of CPU).
    proc = load("--runs", 4, "--concurrency", "1,4", "--max-concurrent", 2, "--flow", flow, "--tools-dir", tools)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[0] for c in cells] == ["1", "4"]
    assert all(c[1] == "4" and c[2] == "4" and c[4] == "0" and c[-1] == "nothing" for c in cells)
    assert cells[0][3] == "0" and int(cells[1][3]) > 0  # four callers, two slots: refusals
    assert float(cells[1][8]) > 10  # peak RSS in MiB


def test_a_tool_that_tries_to_escape_leaves_nothing_behind(tmp_path):
    # A `setsid` child used to outlive its call; the call now ends by killing every descendant.
    tools = write_tools(tmp_path / "tools", {"a": "#!/bin/sh\nsetsid sleep 3 >/dev/null 2>&1 &\nsleep 0.1\ncat\n"})
    flow = tool_chain("leaky", ["a"]).write(tmp_path / "leaky.json")
    proc = load("--runs", 2, "--concurrency", 1, "--flow", flow, "--tools-dir", tools)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"\| nothing \|$", proc.stdout.strip().splitlines()[-1]), proc.stdout


def test_the_leak_check_finds_a_process_in_a_workspace(tmp_path):
    tool_processes = _load_module().tool_processes

    work = tmp_path / "work"
    # /proc shows a process's own environment only between its exec and its next one (before, this
    # process's copy; during one, nothing): the shell says it has started, then waits in a builtin.
    child = subprocess.Popen(["sh", "-c", "echo started; read line"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={"HEDDLE_WORKSPACE": f"{work}/ws-1", "PATH": "/usr/bin:/bin"})
    try:
        assert child.stdout is not None and child.stdout.readline() == b"started\n"
        assert child.pid in tool_processes(work)
        assert child.pid not in tool_processes(tmp_path / "elsewhere")
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_load_is_bounded():
    proc = load("--runs", 10**6)
    assert proc.returncode == 2 and "--runs 1000000: give 1 to 20000" in proc.stderr
    proc = load("--concurrency", "0")
    assert proc.returncode == 2 and "each concurrency must be 1 to 256" in proc.stderr
    proc = load("--serve", "echo,nothing")
    assert proc.returncode == 2 and "choose among echo, no-tool, 3-tool" in proc.stderr


def test_load_seals_and_serves_the_demo_bundle(tmp_path):
    # One level (a server start each): a table of several levels is test_load_reports_a_table_...'s.
    # With the echo floor beside it (its own process): the demo's requests/s as a ratio to the floor's.
    proc = load("--runs", 3, "--concurrency", "3", "--max-concurrent", 2, "--serve", "echo,3-tool")
    assert proc.returncode == 0, proc.stderr
    assert "the sealed 3-ToolNode demo bundle" in proc.stdout and "a bare ASGI JSON echo app" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if re.match(r"\| \d+ \| ", line)]
    assert len(rows) == 2 and all(row.endswith("| nothing |") for row in rows)
    assert re.search(r"^\| 3-tool \| 3 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|", proc.stdout, re.MULTILINE)


def _load_module():
    spec = importlib.util.spec_from_file_location("load", LOAD)
    assert spec is not None and spec.loader is not None
    load_module = importlib.util.module_from_spec(spec)
    sys.modules["load"] = load_module  # its dataclasses look their module up there
    spec.loader.exec_module(load_module)
    return load_module


def test_the_tracing_aim_is_read_against_both_untraced_servers():
    load_module = _load_module()

    def result(label, rates):  # one turn a second long per rate, 1 s of CPU each
        return load_module.Result(concurrency=4, runs=100 * len(rates), label=label, ok=sum(rates),
                                  seconds=float(len(rates)), turns=[(r, 1.0, 1.0) for r in rates])

    # The untraced server was lucky in every turn: against it alone the traced one is 4% short; against
    # the mean of it and its twin (driven just before and just after), 2%.
    base, traced, twin = result("3-tool", [100, 100, 100]), result("3-tool+otel", [96, 96, 96]), \
        result("3-tool+twin", [96, 96, 96])
    row = next(line for line in load_module.tracing_cost([base, traced, twin]).splitlines()
               if line.startswith("| 3-tool+otel |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5].startswith("96.0%") and cells[6].startswith("96.0%")  # alone; the twin's
    assert cells[7] == "98.0% (98.0 to 98.0)" and cells[-1] == "within 3%: met, but the twin is 4.0% off: not shown"
    # Without a twin the aim is read against the untraced server alone.
    row = load_module.tracing_cost([base, traced]).splitlines()[-1]
    assert row.endswith("| within 3%: missed |")


def test_wrk_figures_are_read_from_what_it_prints():
    load_module = _load_module()
    printed = """Running 5s test @ http://127.0.0.1:40000/v1/runs
  1 threads and 64 connections
  Latency Distribution
     50%   48.10ms
     75%   52.00ms
     90%   55.31ms
     99%    1.20s
  6330 requests in 5.00s, 1.10MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 4
Requests/sec:   1266.03
"""
    assert load_module.parse_wrk(printed) == (1266.03, 1200.0, 9)
    assert load_module.parse_wrk(printed.replace("1.20s", "750.00us"))[1] == 0.75
