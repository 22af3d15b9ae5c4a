"""The fleet rehearsal (scripts/fleet): on loopback a registry, one PostgreSQL, three heddle-server
replicas following oci://.../agent:prod with sessions and recovery on, and HAProxy in front checking
/readyz; while scripts/load's mixed load (stateless runs, session turns, durable session runs) goes
through HAProxy:
  1. release: a new version is pushed to the tag;
  2. rollout: each replica in turn gets SIGTERM, drains, and starts again on the same port;
  3. crash: one replica is SIGKILLed while durable runs are in flight on it; another finishes them.
It prints a markdown table per phase (requests, failures by cause, p50/p99, versions served) and what
each step checked; `--json` prints the same as one JSON object, `--write docs/fleet.md` keeps the
table there, and `--short` is the form the tests run (short phases, a short lease and pull interval).
Exits 1 when a step's check fails."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import httpx  # noqa: E402
from load_mixed import Mixed, percentile  # noqa: E402  (scripts/load --url)

import heddle  # noqa: E402
import heddle.oci  # noqa: E402
from heddle.format.keys import generate  # noqa: E402

SERVER = Path(sys.executable).parent / "heddle-server"
REPLICAS = 3
PREFIX = "heddle-server listening on "
KEY = "fleet-rehearsal-session-key-0123456789abcdef"
# How long a draining replica keeps its port open: HAProxy sees /readyz turn 503 within two checks
# (200 ms) and stops sending it requests before the port closes (in Kubernetes, the preStop pause).
DRAIN_DELAY = "1s"
# HAProxy's own error answers, in heddle-server's error shape, and closing the connection: HAProxy closes
# a client's connection after an error it made, and without `connection: close` a client sends its
# next request on that connection and loses it (an error nobody logged).
HAPROXY_ERRORS = {502: ("bad_gateway", "the connection to the replica broke before it answered"),
                  503: ("no_replica", "no replica is ready"),
                  504: ("gateway_timeout", "the replica did not answer in time")}


@dataclass(frozen=True)
class Timing:
    """How long each part of the rehearsal lasts."""

    phase_s: float  # the load in each phase, after its event
    pull_interval: str
    lease: str
    durable_s: float  # how long a durable run's tool takes
    workers: int


FULL = Timing(phase_s=10.0, pull_interval="2s", lease="5s", durable_s=1.0, workers=6)
# The lease is the full form's: on a machine this busy a live owner's renewal can come seconds late, and a
# shorter lease would have another replica take over a run that is still going (the durable-runs' rule).
SHORT = Timing(phase_s=0.5, pull_interval="500ms", lease="5s", durable_s=0.6, workers=6)


def _tool(version: int, durable_s: float) -> str:
    # A durable run (input "durable") lasts durable_s; any other answers at once. Both say their version.
    return ("#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *durable*) sleep " + str(durable_s) + ";; esac\n"
            "echo '{\"v\": " + str(version) + "}'\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", duration)
    assert match is not None, duration
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def haproxy() -> str | None:
    """Debian's haproxy (in /usr/sbin, off a user's PATH)."""
    return shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if os.access(p, os.X_OK)), None)


@dataclass
class Replica:
    name: str
    port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Fleet:
    root: Path
    registry: str  # host:port
    dsn: str
    timing: Timing
    replicas: list[Replica] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    front: str = ""
    bundles: dict[int, Path] = field(default_factory=dict)
    pub: Path | None = None

    @property
    def tag(self) -> str:
        return f"oci://{self.registry}/agent:prod"

    @property
    def log(self) -> Path:
        return self.root / "haproxy.log"

    def seal(self) -> None:
        from tests.server.flows import one_tool_flow
        from tests.support.flows import write_script

        key = generate(self.root / "release", None)
        self.pub = key.public_path
        flow = one_tool_flow("agent", "answer", outputs=("v",)).write(self.root / "agent.json")
        for version in (1, 2):
            tools = self.root / f"tools-v{version}"
            write_script(tools, "answer", _tool(version, self.timing.durable_s))
            self.bundles[version] = heddle.seal(flow, tools_dir=tools, sign_key=key.private_path,
                                                output=self.root / f"v{version}.heddle").path

    def start(self, replica: Replica) -> None:
        replica.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HEDDLE_SESSION_STORE": self.dsn, "HEDDLE_SESSION_KEY": KEY,
               "HEDDLE_CACHE_DIR": str(replica.folder / "cache")}
        argv = [str(SERVER), "--bundle", self.tag, "--trust", str(self.pub),
                "--pull-interval", self.timing.pull_interval, "--recover", "--session-lease", self.timing.lease,
                "--drain-timeout", "30s", "--drain-delay", DRAIN_DELAY, "--max-concurrent", "32", "--host", "127.0.0.1",
                "--port", str(replica.port), "--quiet"]
        with open(replica.folder / "stderr", "ab") as stderr:
            replica.process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=stderr, cwd=replica.folder)
        assert replica.process.stdout is not None
        line = replica.process.stdout.readline().decode(errors="replace")
        if not line.startswith(PREFIX):
            raise RuntimeError(f"{replica.name} did not start: {(replica.folder / 'stderr').read_text()[-2000:]}")

    def stop(self, replica: Replica, sig: int) -> None:
        assert replica.process is not None
        replica.process.send_signal(sig)
        replica.process.wait(60)
        assert replica.process.stdout is not None
        replica.process.stdout.close()

    def up(self) -> None:
        self.seal()
        heddle.oci.push(self.bundles[1], self.tag)
        self.replicas = [Replica(f"r{i + 1}", _free_port(), self.root / f"r{i + 1}") for i in range(REPLICAS)]
        threads = [threading.Thread(target=self.start, args=(r,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.process is not None and r.process.poll() is None for r in self.replicas), "a replica did not start"
        port = _free_port()
        self.front = f"http://127.0.0.1:{port}"
        servers = "\n".join(f"  server {r.name} 127.0.0.1:{r.port} check" for r in self.replicas)
        errors = "\n".join(
            f"  http-error status {status} content-type application/json "
            f"string '{json.dumps({'error': {'type': kind, 'message': message}})}' hdr connection close"
            for status, (kind, message) in HAPROXY_ERRORS.items())
        # /readyz every 100 ms, out at the second 503 in a row (one slow answer of a busy replica is no
        # reason), back at the first 200. A request that met a replica that had just begun to drain (503
        # before any run started) or a closed port is sent to another: nothing was done for it yet, so it
        # is safe to send again. A request whose replica's connection broke after it was sent is not: the
        # run may have begun (502).
        config = f"""global
  maxconn 512
  log stderr format raw local0
defaults
  mode http
  log global
  option httplog
  timeout connect 1s
  timeout client 60s
  timeout server 60s
  option http-buffer-request
  retries 3
  option redispatch 1
  retry-on conn-failure 503
  # A new server connection for every request: a draining replica closes its idle ones, and a request
  # sent on one it is closing could be answered by nobody.
  option http-server-close
{errors}
frontend front
  bind 127.0.0.1:{port}
  capture request header x-request-id len 64
  default_backend heddle
backend heddle
  balance roundrobin
  option httpchk
  http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
  http-check expect status 200
  timeout check 2s
  default-server inter 100ms fall 2 rise 1
{servers}
"""
        (self.root / "haproxy.cfg").write_text(config)
        program = haproxy()
        assert program is not None
        with open(self.log, "wb") as log:
            self.haproxy = subprocess.Popen([program, "-db", "-f", str(self.root / "haproxy.cfg")],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.front}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or self.haproxy.poll() is not None:
                raise RuntimeError("HAProxy never answered: " + self.log.read_text()[-2000:])
            time.sleep(0.05)

    def down(self) -> None:
        for r in self.replicas:
            if r.process is not None and r.process.poll() is None:
                r.process.kill()
                r.process.wait()
            if r.process is not None and r.process.stdout is not None:
                r.process.stdout.close()
        if self.haproxy is not None:
            self.haproxy.terminate()
            self.haproxy.wait()

    def caps(self, replica: Replica) -> dict[str, Any] | None:
        try:
            caps: dict[str, Any] = httpx.get(f"{replica.url}/v1/capabilities", timeout=5).json()
            return caps
        except httpx.HTTPError:
            return None

    def digests(self) -> list[str]:
        return [c["bundle"]["digest"] if c is not None else "down" for c in map(self.caps, self.replicas)]


def _durable_tool_under(pid: int) -> bool:
    """Whether a durable run's tool (its `sleep`) runs among the descendants of process `pid`."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    for child in parents:
        up = child
        while up in parents and up != pid and up > 1:
            up = parents[up]
        if up == pid and child != pid:
            with contextlib.suppress(OSError):
                if (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")[0].endswith(b"sleep"):
                    return True
    return False


@dataclass(frozen=True)
class Routed:
    """One request as HAProxy logged it."""

    server: str  # the replica it went to, or <NOSRV>
    status: int
    state: str  # HAProxy's termination state: ---- when it ended normally


def haproxy_log(text: str) -> tuple[dict[str, Routed], list[tuple[str, str]]]:
    """The requests HAProxy logged, by x-request-id, and its servers' state changes (name, UP or DOWN
    and the reason)."""
    routed: dict[str, Routed] = {}
    changes: list[tuple[str, str]] = []
    line_re = re.compile(r" front heddle/(\S+) \S+ (-?\d+) \S+ \S+ \S+ (\S{4}) \S+ \S+ \{([^}]*)\}")
    change_re = re.compile(r"Server heddle/(\S+) is (UP|DOWN)(.*)")
    for line in text.splitlines():
        m = line_re.search(line)
        if m is not None and m[4]:
            routed[m[4]] = Routed(m[1], int(m[2]), m[3])
            continue
        c = change_re.search(line)
        if c is not None:
            changes.append((c[1], f"{c[2]}{c[3]}"))
    return routed, changes


@dataclass
class Result:
    """What the rehearsal found: per phase the load's outcomes, and each step's checks."""

    phases: dict[str, dict[str, Any]]
    versions: list[tuple[str, str]]
    steps: dict[str, dict[str, Any]]
    failures: list[dict[str, Any]] = field(default_factory=list)  # each failed request: where it went
    messages: dict[str, str] = field(default_factory=dict)  # an answer or error for each cause
    seconds: dict[str, float] = field(default_factory=dict)  # how long each part took (up, each step)

    @property
    def problems(self) -> dict[str, list[str]]:
        return {name: step["problems"] for name, step in self.steps.items()}

    def as_json(self) -> dict[str, Any]:
        return {"phases": self.phases, "versions": [{"when": w, "serving": s} for w, s in self.versions],
                "steps": self.steps, "failures": self.failures, "messages": self.messages, "seconds": self.seconds,
                "passed": not any(self.problems.values())}

    def table(self) -> str:
        lines = ["| phase | requests | failed | failures by cause | p50 ms | p99 ms | versions answered |",
                 "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
        for name, p in self.phases.items():
            causes = ", ".join(f"{c}: {k}" for c, k in p["failures"].items()) or "-"
            answered = ", ".join(f"v{v}: {k}" for v, k in sorted(p["versions"].items()))
            lines.append(f"| {name} | {p['requests']} | {p['failed']} | {causes} | {p['p50_ms']:.0f} | "
                         f"{p['p99_ms']:.0f} | {answered} |")
        lines += ["", "| when | each replica serves |", "| --- | --- |"]
        lines += [f"| {when} | {what} |" for when, what in self.versions]
        lines += ["", "| step | what was checked | result |", "| --- | --- | --- |"]
        for name, step in self.steps.items():
            lines.append(f"| {name} | {step['said']} | {'; '.join(step['problems']) or 'passed'} |")
        return "\n".join(lines)


def _phase_rows(load: Mixed, routed: dict[str, Routed], victim: str) -> dict[str, dict[str, Any]]:
    phases: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(o.phase for o in load.outcomes):
        mine = [o for o in load.outcomes if o.phase == name]
        failures: Counter[str] = Counter()
        for o in mine:
            if o.cause == "ok":
                continue
            where = routed.get(o.request_id)
            if where is None:
                failures[f"{o.cause}, closed by HAProxy unanswered and unlogged"] += 1
            elif where.state != "----":
                on = "the killed replica" if where.server == victim and name.startswith("3") else where.server
                failures[f"{o.cause} on {on} ({where.state})"] += 1
            else:
                failures[o.cause] += 1
        seconds = [o.seconds * 1000 for o in mine if o.cause == "ok"]
        phases[name] = {"requests": len(mine), "failed": sum(failures.values()), "failures": dict(failures),
                        "p50_ms": percentile(seconds, 0.5), "p99_ms": percentile(seconds, 0.99),
                        "versions": dict(Counter(o.version for o in mine if o.version is not None))}
    return phases


def rehearse(fleet: Fleet) -> Result:
    timing = fleet.timing
    versions: list[tuple[str, str]] = []
    names: dict[str, str] = {}

    def snapshot(when: str) -> None:
        digests = fleet.digests()
        for d in digests:
            if d != "down" and d not in names:
                names[d] = f"v{len(names) + 1}"
        served = zip(fleet.replicas, digests, strict=True)
        versions.append((when, ", ".join(f"{r.name}={names.get(d, d)}" for r, d in served)))

    began = time.monotonic()
    fleet.up()
    timings = {"up": time.monotonic() - began}
    steps: dict[str, dict[str, Any]] = {}
    victim = fleet.replicas[0]
    try:
        snapshot("start")
        with Mixed(fleet.front, workers=timing.workers) as load:
            load.wait_for(lambda o: o.kind == "session" and o.cause == "ok")
            # 1. release
            load.phase = "1 release"
            v1 = set(fleet.digests())
            pushed = time.monotonic()
            load.mark("pushed")
            heddle.oci.push(fleet.bundles[2], fleet.tag)
            deadline = pushed + 10 * _seconds(timing.pull_interval) + 60
            while set(fleet.digests()) & v1 and time.monotonic() < deadline:
                time.sleep(0.05)
            swapped = time.monotonic() - pushed
            snapshot(f"release + {swapped:.1f} s")
            released = versions[-1][1]
            load.mark("swapped")
            time.sleep(timing.phase_s)
            # The conversations begun on the old release end before the rollout: a replica that starts
            # again holds only the release it started with.
            load.new_conversations()
            # 2. rollout
            load.phase = "2 rollout"
            timings["release"] = time.monotonic() - pushed
            rolled = time.monotonic()
            for replica in fleet.replicas:
                fleet.stop(replica, signal.SIGTERM)
                snapshot(f"{replica.name} drained")
                fleet.start(replica)
                time.sleep(0.3)  # a few health checks: back in HAProxy's pool
            snapshot("rolled")
            timings["rollout"] = time.monotonic() - rolled
            time.sleep(timing.phase_s)
            # 3. crash, once a durable run is in flight on the victim (its tool's `sleep` runs under it)
            load.phase = "3 crash"
            assert victim.process is not None
            deadline = time.monotonic() + 60
            while not _durable_tool_under(victim.process.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            caps = fleet.caps(victim)
            in_flight = caps["runsInFlight"] if caps is not None else 0
            seen = fleet.log.stat().st_size
            load.mark("killed")
            fleet.stop(victim, signal.SIGKILL)
            # Until HAProxy takes it out, it still sends the victim requests: they die with it too.
            while f"heddle/{victim.name} is DOWN" not in fleet.log.read_text(errors="replace")[seen:] \
                    and time.monotonic() < deadline + 60:
                time.sleep(0.02)
            load.mark("out")
            snapshot(f"{victim.name} killed")
            time.sleep(timing.phase_s)
            load.phase = "after"
        # Each session run whose connection broke, read back from its session through HAProxy once
        # another replica finished it.
        read_back = load.read_back(fleet.front, deadline=time.monotonic() + 10 * _seconds(timing.lease) + 30)
        timings["crash"] = time.monotonic() - load.marks["killed"]
        snapshot("end")
    finally:
        fleet.down()
    routed, changes = haproxy_log(fleet.log.read_text(errors="replace"))
    load.outcomes = [o for o in load.outcomes if o.phase != "after"]
    phases = _phase_rows(load, routed, victim.name)
    failures = [{"phase": o.phase, "id": o.request_id, "cause": o.cause, "seconds": round(o.seconds, 3),
                 "at": round(o.started - load.marks["pushed"], 3), "routed": str(routed.get(o.request_id))}
                for o in load.outcomes if o.cause != "ok"]

    # 1. release: every replica serves v2; no request failed; each conversation answered one version.
    problems = []
    if "v1" in released or "down" in released:
        problems.append(f"not every replica served the new release ({released})")
    failed = phases.get("1 release", {}).get("failed", 0)
    if failed:
        problems.append(f"{failed} request(s) failed: {phases['1 release']['failures']}")
    conversations = load.conversations()
    mixed = [n for n, turns in conversations.items() if len({t.version for t in turns}) > 1]
    if mixed:
        problems.append(f"{len(mixed)} conversation(s) answered by two versions")
    crossed = sum(1 for turns in conversations.values()
                  if turns[0].started < load.marks["pushed"] and turns[-1].started > load.marks["swapped"])
    if not crossed:
        problems.append("no conversation begun before the push went on after every replica swapped")
    steps["1 release"] = {
        "problems": problems, "swapped_s": round(swapped, 2), "pull_interval_s": _seconds(timing.pull_interval),
        "conversations_across_the_swap": crossed,
        "said": f"every replica served v2 {swapped:.1f} s after the push (pull interval "
                f"{timing.pull_interval}); {crossed} conversation(s) begun on v1 went on across the swap, each on "
                f"v1; no request failed"}

    # 2. rollout: HAProxy took each replica out when its /readyz turned 503, and no request failed.
    problems = []
    out_by_readiness = sorted({name for name, what in changes if what.startswith("DOWN") and "code: 503" in what})
    others = [f"{name} {what.strip()}" for name, what in changes if what.startswith("DOWN") and "code: 503" not in what
              and name != victim.name]
    if out_by_readiness != sorted(r.name for r in fleet.replicas):
        problems.append(f"HAProxy took out on a 503 from /readyz only {out_by_readiness}; {others}")
    failed = phases.get("2 rollout", {}).get("failed", 0)
    if failed:
        problems.append(f"{failed} request(s) failed: {phases['2 rollout']['failures']}")
    steps["2 rollout"] = {"problems": problems, "out_by_readiness": out_by_readiness,
                          "said": "each replica drained on SIGTERM; HAProxy took it out when /readyz turned 503 "
                                  "(its log), and brought it back once started; no request failed"}

    # 3. crash: the only failures are requests on the killed replica, and each session run among them was
    # finished by another replica and read back from its session.
    problems = []
    crash = [o for o in load.outcomes if o.phase == "3 crash" and o.cause != "ok"]
    # On the killed replica: sent there, as HAProxy logged it; or, where HAProxy logged nothing (it closed
    # the client's connection when the replica's broke), sent before HAProxy took the replica out and
    # still unanswered when it was killed.
    killed, out = load.marks["killed"], load.marks["out"]
    elsewhere = [o for o in crash if (routed[o.request_id].server != victim.name if o.request_id in routed
                                      else not (o.started < out and killed < o.started + o.seconds))]
    if elsewhere:
        problems.append(f"{len(elsewhere)} failed request(s) were not on the killed replica")
    # Each session run lost with it, read back: finished by another replica (recovered), or by the killed
    # one before it answered, or never begun there (the session as it was); never left unfinished.
    sessions = [o for o in crash if o.session is not None]
    back = [read_back.get(o.session or "", {}) for o in sessions]
    recovered = sum(1 for b in back if b.get("recovered"))
    unclear = [b for b in back if b.get("status") != "idle" or b.get("turns") not in (
        b.get("turns_before"), (b.get("turns_before") or 0) + 1)]
    if unclear:
        problems.append(f"{len(unclear)} session run(s) not read back finished or untouched: {unclear}")
    if not recovered:
        problems.append("no session run of the killed replica was finished by another")
    if in_flight < 1 or not sessions:
        problems.append(f"no durable run was lost with the killed replica ({in_flight} run(s) in flight)")
    steps["3 crash"] = {
        "problems": problems, "in_flight_at_kill": in_flight, "failed": len(crash),
        "session_runs_lost": len(sessions), "read_back_recovered": recovered, "read_back_unclear": len(unclear),
        "others_lost": len(crash) - len(sessions),
        "said": f"{victim.name} was killed with {in_flight} run(s) in flight; {len(crash)} request(s) failed, all "
                f"on it; its {len(sessions)} session run(s) read back from their sessions, {recovered} finished by "
                f"another replica, the others finished by it before it died or never begun; the "
                f"{len(crash) - len(sessions)} other(s), stateless runs and new sessions, have no session to read back"}
    return Result(phases, versions, steps, failures, dict(load.messages),
                  {k: round(v, 1) for k, v in timings.items()})


@contextlib.contextmanager
def services(root: Path) -> Iterator[tuple[str, str]]:
    """A registry and a PostgreSQL of their own, on loopback, removed after."""
    from tests.support.postgres import fresh_schema, throwaway_cluster
    from tests.support.registry import running_registry

    with running_registry(root / "registry") as registry, throwaway_cluster() as dsn:
        yield registry.address, fresh_schema(dsn)


def run(root: Path, registry: str, dsn: str, timing: Timing, *, logs: Path | None = None) -> Result:
    """The rehearsal in `root`, against a registry and a Postgres already running."""
    fleet = Fleet(root, registry, dsn, timing)
    try:
        return rehearse(fleet)
    finally:
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            for path in [fleet.log, *(r.folder / "stderr" for r in fleet.replicas)]:
                if path.exists():
                    shutil.copy(path, logs / f"{path.parent.name}-{path.name}" if path.name == "stderr" else logs)


def write_table(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else ""
    marker = "<!-- fleet table -->"
    head = text.split(marker)[0] if marker in text else text
    path.write_text(f"{head}{marker}\n{table}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/fleet", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--short", action="store_true", help="Short phases, lease and pull interval (the tests' form).")
    p.add_argument("--phase-seconds", type=float, help="How long the load runs in each phase after its event.")
    p.add_argument("--json", action="store_true", help="Print the result as one JSON object.")
    p.add_argument("--write", type=Path, help="Also write the table into this markdown file (docs/fleet.md).")
    p.add_argument("--logs", type=Path, help="Keep HAProxy's and each replica's log in this folder.")
    args = p.parse_args(argv)
    if haproxy() is None:
        print("scripts/fleet: haproxy is not installed: apt-get install haproxy", file=sys.stderr)
        return 1
    timing = SHORT if args.short else FULL
    if args.phase_seconds is not None:
        timing = Timing(args.phase_seconds, timing.pull_interval, timing.lease, timing.durable_s, timing.workers)
    with tempfile.TemporaryDirectory(prefix="heddle-fleet-") as folder:
        root = Path(folder)
        os.chmod(root, 0o755)
        with services(root) as (registry, dsn):
            result = run(root, registry, dsn, timing, logs=args.logs)
    if args.json:
        print(json.dumps(result.as_json(), indent=1))
    else:
        print(result.table())
    if args.write:
        write_table(args.write, result.table())
    return 1 if any(result.problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
