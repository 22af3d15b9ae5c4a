"""Kill a durable `heddle run` again and again, resume it each time, and check what its tools saw.

Shared by the suite's chaos test (tests/sessions/test_chaos.py, 20 kills) and its longer form in
`scripts/bench` (200 kills): an agent makes CALLS tool calls one after another (the model here answers
from the conversation, so a resumed run gets the same answers); each call of the tool appends its
HEDDLE_IDEMPOTENCY_KEY and its argument to a log. Each `heddle run --durable` is SIGKILLed at a random
moment after the log grows, then `--resume`d, until the run finishes. Then:

- no completed call ran again: the only key a run may repeat is the last one the killed run logged,
  as its first call, at most once per kill (a call whose result was lost runs again with its key);
- every call ran, each position with one key and one argument;
- the outputs are those of the same run never killed.

A `heddle` process costs some 0.5 s to start, mostly imports; so that hundreds of kills take seconds,
each run (the killed ones and the calm one) is a fork of one process that imported heddle once, with
what a run imports on its way (`Forks`), running `heddle.cli.main` with its argv: the CLI's own code
from there on, killed as a process of its own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from heddle.model.scripted import ScriptedModel, base_url, bind
from tests.support.flows import FlowDoc, llm_config, server_tool, write_script

# The process each run is forked from: heddle's run path imported once (with what a run imports lazily, so
# that no fork imports it again), then one fork per line of JSON read on stdin ({"id", "argv", "env", "out",
# "err"}). It answers each line with "ID pid PID", and each fork's end with "ID status STATUS": one process
# runs the killed run and the calm one side by side. One thread only (forks of a threaded process may inherit
# a held lock): it waits for stdin and for its children in turn.
_FORKS = r"""
import json, os, select, sys
sys.modules.setdefault("httpx._main", None)
import heddle.cli.root, heddle.cli.run, heddle.cli.errors, heddle.cli.sessions, heddle.cli.waiting, heddle.runs
import heddle.engine.run, heddle.engine.agent, heddle.engine.nodes, heddle.engine.api, heddle.engine.multiagent
import heddle.sessions.sqlite, heddle.sessions.seal, heddle.sessions.turn, heddle.sessions.open, heddle.model.client
import heddle.tools.process, heddle.tools.spawner, heddle.tools.provided, heddle.workspace.workspace
import heddle.cli.answers, heddle.cli.opening, heddle.cli.target, heddle.engine.inputs, heddle.tools.command_run
import heddle.bundle.egress, heddle.format.frame, heddle.core, heddle.cli
import httpcore, httpx, anyio, h11, certifi, typer, typer.main, click
import anyio._backends._asyncio, anyio._core._sockets, anyio._core._synchronization, anyio.streams.tls
from pathlib import Path
from heddle.settings import RunSettings
# The document read once: the validators of its component types are built here, not in every run.
heddle.runs.from_document(Path(sys.argv[1]), RunSettings(), tools_dir=Path(sys.argv[2]))
children = {}
stdin = sys.stdin.fileno()
buffered = b""
while True:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        print(children.pop(pid), "status", status, flush=True)
    if not select.select([stdin], [], [], 0.005 if children else None)[0]:
        continue
    more = os.read(stdin, 65536)
    if not more:
        break
    buffered += more
    while b"\n" in buffered:
        line, buffered = buffered.split(b"\n", 1)
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.setsid()
            for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                    (1, job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                    (2, job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                os.dup2(os.open(path, flags, 0o600), fd)
            os.environ.update(job["env"])
            sys.argv = ["heddle", *job["argv"]]
            code = 1
            try:
                heddle.cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = job["id"]
        print(job["id"], "pid", pid, flush=True)
for pid in list(children):
    print(children.pop(pid), "status", os.waitpid(pid, 0)[1], flush=True)
"""


class Forks:
    """Runs `heddle ARGV` as forks of one warm process (see the module's docstring), several at once."""

    def __init__(self, env: dict[str, str], flow: Path, tools: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _FORKS, str(flow), str(tools)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)
        self._heard: dict[tuple[str, str], int] = {}

    def _hear(self, name: str, what: str) -> int:
        assert self.proc.stdout is not None
        while (name, what) not in self._heard:
            line = self.proc.stdout.readline()
            assert line, f"the process runs are forked from ended ({self.proc.wait()})"
            heard, said, value = line.split()
            self._heard[heard, said] = int(value)
        return self._heard.pop((name, what))

    def start(self, name: str, argv: list[str], folder: Path, env: dict[str, str]) -> int:
        """Fork the run `name` (one at a time of each name), its stdout and stderr in `folder`: its pid."""
        assert self.proc.stdin is not None
        job = {"id": name, "argv": argv, "env": env, "out": str(folder / "out"), "err": str(folder / "err")}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._hear(name, "pid")

    def wait(self, name: str, folder: Path) -> tuple[int, str, str]:
        """The run's exit (negative: the signal that ended it), stdout and stderr."""
        status = self._hear(name, "status")
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return code, (folder / "out").read_text(), (folder / "err").read_text()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _Counting(ScriptedModel):
    """A model that asks for the next call until `calls` results are in, then sums them up: its answers
    depend on the conversation alone, so a resumed run that asks again gets the same."""

    def __init__(self, calls: int) -> None:
        super().__init__([], log=lambda line: None)
        self.calls = calls
        self._next: dict[str, Any] = {}

    async def respond(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ClientDisconnect:  # the run was killed while it asked
            return Response(status_code=499)
        results = [json.loads(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"]
        if len(results) < self.calls:
            self._next = {"tool_calls": [{"name": "tick", "arguments": {"n": len(results)}}]}
        else:
            self._next = {"content": f"sum {sum(r['m'] for r in results)} of {len(results)} calls"}
        return await super().respond(request)

    def entry(self, index: int) -> dict[str, Any] | None:
        return self._next


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        pass


@contextmanager
def counting_model(calls: int) -> Iterator[str]:
    """The model's base URL, served from a thread of this process."""
    sock = bind("127.0.0.1", 0)
    server = _Server(uvicorn.Config(_Counting(calls), lifespan="off", log_config=None, log_level="critical",
                                    access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            thread.join(0.01)
        yield base_url(sock)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def agent_flow(root: Path, url: str) -> tuple[Path, Path]:
    """start -> an agent with the tool `tick` -> end: (flow, tools folder)."""
    tools = root / "tools"
    # sh, not Python: hundreds of calls, each an interpreter's start.
    write_script(tools, "tick.sh", '#!/bin/sh\nIFS= read -r args\nn=$(printf %s "$args" | tr -dc 0-9)\n'
                                   'printf "%s %s\\n" "$HEDDLE_IDEMPOTENCY_KEY" "$n" >> "$CHAOS_LOG"\n'
                                   'printf \'{"m": %d}\' $((n * n + 1))\n')
    f = FlowDoc("chaos")
    start = f.start(["query"])
    tick = server_tool("tick", [{"title": "n", "type": "integer"}], [{"title": "m", "type": "integer"}])
    agent = f.agent("worker", llm_config(url), tools=[tick], inputs=("query",), outputs=("result",))
    end = f.end(["result"])
    f.control(start, agent)
    f.control(agent, end)
    return f.write(root / "flow.json"), tools


@dataclass
class Chaos:
    kills: int  # how many runs were killed
    runs: list[list[tuple[str, int]]] = field(default_factory=list)  # the log lines each run added
    outputs: dict[str, Any] = field(default_factory=dict)  # the finished run's
    calm: dict[str, Any] = field(default_factory=dict)  # the same run's, never killed
    calm_log: list[tuple[str, int]] = field(default_factory=list)


def _lines(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    text = log.read_text()
    return [(key, int(n)) for key, n in (line.split() for line in text.splitlines()[: text.count("\n")])]


def run_chaos(root: Path, *, kills: int, calls: int, seed: int, env: dict[str, str]) -> Chaos:
    """Kill the run `kills` times (fewer if it finishes first), resume it until it finishes; the same run
    never killed goes on beside it, in a process of its own."""
    rng = random.Random(seed)
    log, calm_log = root / "chaos.log", root / "calm.log"
    with counting_model(calls) as url:
        flow, tools = agent_flow(root, url)
        common = [str(flow), "-t", str(tools), "--outputs", "--max-tool-rounds", str(calls + 1)]
        (root / "calm").mkdir()
        forks = Forks(env, flow, tools)
        try:
            # Each in a sessions file of its own: neither waits for the other's writes.
            forks.start("calm", ["run", *common, "--session-db", str(root / "calm" / "sessions.db"), "--session",
                                 "calm", "--durable", "--input", '{"query": "go"}'],
                        root / "calm", {"CHAOS_LOG": str(calm_log)})
            done = Chaos(0)
            common += ["--session-db", str(root / "sessions.db"), "--session", "chaos"]
            argv = ["run", *common, "--durable", "--input", '{"query": "go"}']
            while True:
                before = len(_lines(log))
                pid = forks.start("chaos", argv, root, {"CHAOS_LOG": str(log)})
                argv = ["run", *common, "--resume"]
                if done.kills < kills:
                    # Once the run's first call has logged, within the next call or two: in the model's call,
                    # in the tool's, or between a step's end and the store's record of it.
                    _kill_later(pid, log, before + 1, rng.random() * 0.08)
                code, out, err = forks.wait("chaos", root)
                done.runs.append(_lines(log)[before:])
                if code == -signal.SIGKILL:
                    done.kills += 1
                    continue
                assert code == 0, f"run {len(done.runs)} exited {code}: {err}"
                done.outputs = json.loads(out)
                break
            code, out, err = forks.wait("calm", root / "calm")
            assert code == 0, err
            done.calm, done.calm_log = json.loads(out), _lines(calm_log)
            return done
        finally:
            forks.close()


def _kill_later(pid: int, log: Path, lines: int, delay: float) -> None:
    """SIGKILL the run's process group once the log has `lines` lines and `delay` seconds have passed, or
    at once when a line more comes first: a run gets at most two calls further before its kill."""

    def count() -> int:  # whole lines only, as _lines reads them; cheap, since it is polled
        try:
            return log.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    def watch() -> None:
        deadline = time.monotonic() + 60
        while count() < lines and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.002)
        until = time.monotonic() + delay
        while time.monotonic() < until and count() <= lines:
            time.sleep(0.001)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # finished first

    threading.Thread(target=watch, daemon=True).start()


def check(done: Chaos, calls: int) -> None:
    """The guarantees of a durable run's steps (see the module's docstring)."""
    assert [n for _, n in done.calm_log] == list(range(calls)) and len({k for k, _ in done.calm_log}) == calls
    assert done.outputs == done.calm, (done.outputs, done.calm)
    seen: dict[str, int] = {}
    last: str | None = None
    for number, lines in enumerate(done.runs):
        again = [key for key, _ in lines if key in seen]
        # A call whose result the kill lost runs again, first, with the key it had: no other call repeats.
        assert again in ([], [last]) and (not again or lines[0][0] == last), (number, again, last, lines)
        for key, n in lines:
            assert key.startswith("hk-") and seen.setdefault(key, n) == n, (key, n, seen.get(key))
        if lines:
            last = lines[-1][0]
    assert sorted(seen.values()) == list(range(calls))
    repeated = sum(len(lines) for lines in done.runs) - calls
    assert repeated <= done.kills
