"""The fleet rehearsal (scripts/fleet): on loopback a registry, one PostgreSQL, three heddle-server
replicas following oci://.../agent:prod with sessions and recovery on, and HAProxy in front checking
/readyz; while a mixed load (stateless runs, session turns, durable session runs) goes through HAProxy:
  1. release: a new version is pushed to the tag;
  2. rollout: each replica in turn gets SIGTERM, drains, and starts again on the same port;
  3. crash: one replica is SIGKILLed while durable runs are in flight; another finishes them.
It prints a markdown table per phase (requests, failures by cause, p50/p99, versions served)."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import heddle  # noqa: E402
import heddle.oci  # noqa: E402
from heddle.format.keys import generate  # noqa: E402

SERVER = Path(sys.executable).parent / "heddle-server"
REPLICAS = 3
PREFIX = "heddle-server listening on "
KEY = "fleet-rehearsal-session-key-0123456789abcdef"


def _tool(version: int, durable_s: float) -> str:
    # A durable run (input "durable") lasts durable_s; any other answers at once. Both say their version.
    return ("#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *durable*) sleep " + str(durable_s) + ";; esac\n"
            "echo '{\"v\": " + str(version) + "}'\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Outcome:
    phase: str
    kind: str  # stateless, session, durable
    started: float
    seconds: float
    cause: str  # "ok", or why it failed
    version: int | None = None


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
    pull_interval: str
    lease: str
    durable_s: float
    replicas: list[Replica] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    front: str = ""
    bundles: dict[int, Path] = field(default_factory=dict)
    pub: Path | None = None

    @property
    def tag(self) -> str:
        return f"oci://{self.registry}/agent:prod"

    def seal(self) -> None:
        from tests.server.flows import one_tool_flow
        from tests.support.flows import write_script

        key = generate(self.root / "release", None)
        self.pub = key.public_path
        flow = one_tool_flow("agent", "answer", outputs=("v",)).write(self.root / "agent.json")
        for version in (1, 2):
            tools = self.root / f"tools-v{version}"
            write_script(tools, "answer", _tool(version, self.durable_s))
            self.bundles[version] = heddle.seal(flow, tools_dir=tools, sign_key=key.private_path,
                                                output=self.root / f"v{version}.heddle").path

    def start(self, replica: Replica) -> None:
        replica.folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HEDDLE_SESSION_STORE": self.dsn, "HEDDLE_SESSION_KEY": KEY,
               "HEDDLE_CACHE_DIR": str(replica.folder / "cache")}
        argv = [str(SERVER), "--bundle", self.tag, "--trust", str(self.pub), "--pull-interval", self.pull_interval,
                "--recover", "--session-lease", self.lease, "--drain-timeout", "30s", "--max-concurrent", "32",
                "--host", "127.0.0.1", "--port", str(replica.port), "--quiet"]
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
        assert all(r.process is not None and r.process.poll() is None for r in self.replicas)
        port = _free_port()
        self.front = f"http://127.0.0.1:{port}"
        servers = "\n".join(f"  server {r.name} 127.0.0.1:{r.port} check" for r in self.replicas)
        # /readyz every 100 ms, out at the second 503 in a row (one slow answer of a busy replica is no
        # reason), back at the first 200. A request that met a
        # replica that had just begun to drain (503 before any run started) or a closed port is sent
        # to another: nothing was done for it yet, so it is safe to send again.
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
frontend front
  bind 127.0.0.1:{port}
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
        with open(self.root / "haproxy.log", "wb") as log:
            self.haproxy = subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f",
                                             str(self.root / "haproxy.cfg")], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.front}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("HAProxy never answered: " + (self.root / "haproxy.log").read_text()[-2000:])
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

    def digests(self) -> list[str]:
        out = []
        for r in self.replicas:
            try:
                out.append(httpx.get(f"{r.url}/v1/capabilities", timeout=5).json()["bundle"]["digest"])
            except httpx.HTTPError:
                out.append("down")
        return out


class Load:
    """Mixed requests through one URL, on `workers` threads, each outcome noted under the current phase."""

    def __init__(self, url: str, workers: int = 6) -> None:
        self.url, self.workers = url, workers
        self.phase = "warm-up"
        self.outcomes: list[Outcome] = []
        self.lost: list[str] = []  # sessions whose run's connection broke: read back afterwards
        self.messages: dict[str, str] = {}  # one answer's body for each HTTP failure
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(n,)) for n in range(workers)]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _note(self, kind: str, started: float, cause: str, version: int | None = None,
              phase: str | None = None) -> None:
        with self._lock:
            self.outcomes.append(Outcome(phase or self.phase, kind, started, time.monotonic() - started, cause,
                                         version))

    def _run(self, client: httpx.Client, kind: str, body: dict[str, Any]) -> tuple[str, int | None]:
        phase = self.phase
        started = time.monotonic()
        try:
            r = client.post("/v1/runs", json=body)
        except httpx.HTTPError as exc:
            cause = f"connection lost ({kind})"
            with self._lock:
                self.messages[cause] = repr(exc)
            self._note(kind, started, cause, phase=phase)
            return cause, None
        if r.status_code == 200:
            version = r.json()["outputs"]["v"]
            self._note(kind, started, "ok", version, phase=phase)
            return "ok", version
        cause = f"HTTP {r.status_code}"
        if r.status_code == 502:  # HAProxy's answer when the replica's connection broke before it answered
            cause = f"connection lost ({kind})"
        elif r.status_code == 400 and "belongs to bundle" in r.text:
            cause = "session of the previous release (HTTP 400)"  # by design: docs/deploy.md, section 6
        with self._lock:
            self.messages[cause] = r.text[:300]
        self._note(kind, started, cause, phase=phase)
        return cause, None

    def _work(self, n: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                kind = ("stateless", "session", "durable")[n % 3]
                if kind == "stateless":
                    self._run(client, kind, {"inputs": {"x": "go"}})
                    continue
                try:
                    made = client.post("/v1/sessions")
                except httpx.HTTPError:
                    self._note(kind, time.monotonic(), f"connection lost ({kind}, new session)")
                    continue
                if made.status_code != 201:
                    self._note(kind, time.monotonic(), f"HTTP {made.status_code} (new session)")
                    continue
                sid = made.json()["session"]
                turns = 2 if kind == "session" else 1
                for _ in range(turns):
                    cause, _v = self._run(client, kind, {"session": sid, "inputs": {"x": kind}})
                    if cause.startswith("connection"):
                        with self._lock:
                            self.lost.append(sid)
                    if cause != "ok":
                        break


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(outcomes: list[Outcome], versions: list[tuple[str, str]]) -> str:
    lines = ["| phase | requests | failed | failures by cause | p50 ms | p99 ms | versions answered |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for phase in dict.fromkeys(o.phase for o in outcomes):
        mine = [o for o in outcomes if o.phase == phase]
        failed = Counter(o.cause for o in mine if o.cause != "ok")
        seconds = [o.seconds * 1000 for o in mine if o.cause == "ok"]
        answered = Counter(o.version for o in mine if o.version is not None)
        lines.append(f"| {phase} | {len(mine)} | {sum(failed.values())} | "
                     f"{', '.join(f'{c}: {k}' for c, k in failed.items()) or '-'} | "
                     f"{statistics.median(seconds) if seconds else 0:.0f} | {_percentile(seconds, 0.99):.0f} | "
                     f"{', '.join(f'v{v}: {k}' for v, k in sorted(answered.items()))} |")
    lines += ["", "| when | each replica serves |", "| --- | --- |"]
    lines += [f"| {when} | {what} |" for when, what in versions]
    return "\n".join(lines)


@dataclass
class Report:
    outcomes: list[Outcome]
    versions: list[tuple[str, str]]
    recovered: dict[str, Any]
    swapped_within_s: float
    table: str
    pushed_at: float  # time.monotonic() of the push, and of the last replica's swap
    swapped_at: float


def rehearse(fleet: Fleet, *, phase_s: float) -> Report:
    versions: list[tuple[str, str]] = []
    names: dict[str, str] = {}

    def snapshot(when: str) -> None:
        digests = fleet.digests()
        for d in digests:
            if d != "down" and d not in names:
                names[d] = f"v{len(names) + 1}"
        served = zip(fleet.replicas, digests, strict=True)
        versions.append((when, ", ".join(f"{r.name}={names.get(d, d)}" for r, d in served)))

    fleet.up()
    recovered: dict[str, Any] = {}
    try:
        snapshot("start")
        with Load(fleet.front) as load:
            time.sleep(phase_s)
            # 1. release
            load.phase = "1 release"
            v1 = set(fleet.digests())
            pushed = time.monotonic()
            heddle.oci.push(fleet.bundles[2], fleet.tag)
            while set(fleet.digests()) & v1:
                time.sleep(0.05)
            swapped_at = time.monotonic()
            swapped = swapped_at - pushed
            snapshot(f"release + {swapped:.1f} s")
            time.sleep(phase_s)
            # 2. rollout
            load.phase = "2 rollout"
            for replica in fleet.replicas:
                fleet.stop(replica, signal.SIGTERM)
                snapshot(f"{replica.name} drained")
                fleet.start(replica)
                time.sleep(0.3)  # two health checks: back in HAProxy's pool
            snapshot("rolled")
            time.sleep(phase_s)
            # 3. crash, while durable runs are in flight on every replica
            load.phase = "3 crash"
            victim = fleet.replicas[0]
            time.sleep(fleet.durable_s / 2)
            fleet.stop(victim, signal.SIGKILL)
            snapshot(f"{victim.name} killed")
            time.sleep(phase_s)
            load.phase = "after"
        # Each durable run whose connection broke, read back from its session through HAProxy.
        with httpx.Client(base_url=fleet.front, timeout=60) as client:
            for sid in load.lost:
                shown = client.get(f"/v1/sessions/{sid}/events", timeout=60)
                last = shown.text.strip().splitlines()
                state = client.get(f"/v1/sessions/{sid}").json()
                recovered[sid] = {"status": state.get("status"), "last": state.get("last"),
                                  "events": shown.status_code, "tail": last[-1:] if last else []}
        snapshot("end")
    finally:
        fleet.down()
    outcomes = [o for o in load.outcomes if o.phase != "after"]
    for cause, body in load.messages.items():
        print(f"{cause}: {body}", file=sys.stderr)
    return Report(outcomes, versions, recovered, swapped, table(outcomes, versions), pushed, swapped_at)


def summary(report: Report) -> str:
    finished = sum(1 for r in report.recovered.values() if r["status"] == "idle" and r["last"])
    return (f"Every replica served the new release {report.swapped_within_s:.1f} s after the push. Session runs "
            f"whose connection was on the killed replica: {len(report.recovered)}, each read back from its "
            f"session: {finished} finished by another replica.")


@contextlib.contextmanager
def services(root: Path) -> Iterator[tuple[str, str]]:
    """A registry and a PostgreSQL of their own, on loopback, removed after."""
    from tests.support.postgres import fresh_schema, throwaway_cluster
    from tests.support.registry import running_registry

    with running_registry(root / "registry") as registry, throwaway_cluster() as dsn:
        yield registry.address, fresh_schema(dsn)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/fleet", description=__doc__.splitlines()[0])
    p.add_argument("--phase-seconds", type=float, default=10.0, help="How long the load runs in each phase.")
    p.add_argument("--pull-interval", default="2s")
    p.add_argument("--write", type=Path, help="Also write the table into this markdown file (docs/fleet.md).")
    args = p.parse_args(argv)
    if shutil.which("haproxy") is None:
        print("scripts/fleet: haproxy is not installed: apt-get install haproxy", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="heddle-fleet-") as folder:
        root = Path(folder)
        os.chmod(root, 0o755)
        with services(root) as (registry, dsn):
            # On one host a replica whose process is gone is taken over at once; the lease is for hosts.
            fleet = Fleet(root, registry, dsn, args.pull_interval, lease="5s", durable_s=1.0)
            report = rehearse(fleet, phase_s=args.phase_seconds)
    print(report.table)
    print(f"\n{summary(report)}")
    if args.write:
        text = args.write.read_text() if args.write.exists() else ""
        marker = "<!-- fleet table -->"
        head = text.split(marker)[0] if marker in text else text
        args.write.write_text(f"{head}{marker}\n{report.table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
