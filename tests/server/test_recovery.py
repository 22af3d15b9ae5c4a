"""A replica that dies in the middle of a session run: another `heddle-server` on the same Postgres store
takes the run over once its owner's lease expired and finishes it, the session shows the result, a
client that reconnects gets it as its stream's last frame, and a load on the survivor sees no request
fail meanwhile. In-process: which runs a sweep takes, two sweeps racing for one run, a sweep that pages
and then reads only what was written since, and a server's session run appending its steps."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client import generate_latest

import heddle
from heddle.engine.journal import Journal
from heddle.server.errors import ApiError
from heddle.sessions.lease import Owner
from heddle.sessions.record import Pending, Record
from heddle.sessions.store import Stored
from tests.server.flows import one_tool_flow
from tests.server.support import metric, sse_frames, start_server, wait_for_file
from tests.support.flows import write_script
from tests.support.memstore import MemStore
from tests.support.postgres import fresh_schema

KEYED = {"HEDDLE_SESSION_KEY": "replicas-share-this-key-" * 2}


# A caller's load on a server, in a process of its own until the file `stop` appears: stateless runs and
# two-turn session runs, two at a time; each answer one line of `out` ("ok", or what failed). It is started
# before the servers are up (its imports overlap theirs) and reads the server's URL from stdin.
_LOAD = r"""
import os, sys, threading, httpx
out, stop = sys.argv[1:3]
url = sys.stdin.readline().strip()
lock = threading.Lock()

def note(line):
    with lock, open(out, "a") as f:
        f.write(line + "\n")

def worker(n):
    with httpx.Client(base_url=url, timeout=30) as client:
        while not os.path.exists(stop):
            try:
                if n % 2:
                    r = client.post("/v1/runs", json={"inputs": {"x": "light"}})
                    ok = r.status_code == 200 and r.json().get("outputs") == {"x": "done"}
                else:
                    made = client.post("/v1/sessions")
                    ok = made.status_code == 201
                    r = made
                    for _ in range(2):
                        if ok:
                            r = client.post("/v1/runs", json={"session": made.json()["session"],
                                                              "inputs": {"x": "light"}})
                            ok = r.status_code == 200 and r.json().get("outputs") == {"x": "done"}
                note("ok" if ok else f"FAIL {r.status_code} {r.text[:300]}")
            except httpx.HTTPError as exc:
                note(f"FAIL {type(exc).__name__} {exc}")

threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
for t in threads: t.start()
for t in threads: t.join()
"""


def _load_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_run_of_a_replica_killed_mid_run_is_finished_by_another(tmp_path: Path, postgres_dsn: str) -> None:
    started, hold, log = tmp_path / "started", tmp_path / "hold", tmp_path / "log"
    # The run given "held" marks its start, then blocks while `hold` is there; the load's runs answer at once.
    tools = tmp_path / "tools"
    write_script(tools, "block", f"#!/bin/sh\nargs=$(cat)\ncase \"$args\" in *held*) echo run >> {log}\n"
                                 f"echo started > {started}\nwhile [ -e {hold} ]; do sleep 0.02; done;; esac\n"
                                 "echo '{\"x\": \"done\"}'\n")
    flow = one_tool_flow("held", "block").write(tmp_path / "flow.json")
    bundle = heddle.seal(flow, tools_dir=tools, output=tmp_path / "held.heddle").path
    env = {**KEYED, "HEDDLE_CACHE_DIR": str(tmp_path / "cache")}
    # A short lease, so that the survivor need not wait long; recovery is on by default with Postgres.
    args = ("--bundle", bundle, "--allow-unsigned", "--session-store", fresh_schema(postgres_dsn),
            "--session-lease", "1s")
    hold.touch()
    load_out, stop = tmp_path / "load.out", tmp_path / "stop"
    load = subprocess.Popen([sys.executable, "-c", _LOAD, str(load_out), str(stop)], stdin=subprocess.PIPE, text=True)
    try:
        with ThreadPoolExecutor(2) as pool:  # the two start-ups overlap
            doomed, survivor = pool.map(lambda name: start_server(tmp_path / name, *args, env=env), ["a", "b"])
    except BaseException:
        load.kill()
        load.wait()
        raise
    try:
        assert load.stdin is not None
        load.stdin.write(survivor.url + "\n")
        load.stdin.close()
        with doomed.client() as on_a:
            sid = on_a.post("/v1/sessions").json()["session"]
        answered: list[Any] = []

        def run() -> None:
            try:
                answered.append(httpx.post(f"{doomed.url}/v1/runs", json={"session": sid, "inputs": {"x": "held"}},
                                           timeout=60))
            except httpx.HTTPError as exc:
                answered.append(exc)

        caller = threading.Thread(target=run)
        caller.start()
        wait_for_file(started)
        while not _load_lines(load_out):  # the load is going on when A dies
            assert load.poll() is None
            time.sleep(0.01)
        doomed.signal(signal.SIGKILL)
        doomed.wait()
        caller.join(30)
        assert answered and isinstance(answered[0], httpx.HTTPError)  # the caller lost its answer with A
        started.unlink()
        hold.unlink()  # the orphaned tool of A ends, and so will B's run of it
        before = len(_load_lines(load_out))

        # The caller reconnects to B, which takes the run over: the stream's last frame says it was recovered.
        with survivor.client() as on_b:
            followed = on_b.get(f"/v1/sessions/{sid}/events", timeout=30)  # finished within 30 s of the lease
            assert followed.status_code == 200, followed.text
            last = sse_frames(followed.text)[-1]
            assert last == ("flow_complete", {"type": "flow_complete", "session": sid, "outputs": {"x": "done"},
                                              "recovered": True}), (last, survivor.stderr())
            shown = on_b.get(f"/v1/sessions/{sid}").json()
            assert shown["status"] == "idle" and shown["turns"] == 1, shown
            assert shown["last"] == {"outputs": {"x": "done"}, "recovered": True}, shown
            scraped = on_b.get("/metrics").text
            assert metric(scraped, "heddle_sessions_recovered_total", 'outcome="ok"') == 1
            assert metric(scraped, "heddle_sessions_unrecovered", 'reason="digest"') == 0
        stop.touch()
        assert load.wait(30) == 0
        # No request of the load on B failed, while A died and B took its run over.
        lines = _load_lines(load_out)
        assert len(lines) > before > 0 and set(lines) == {"ok"}, [x for x in lines if x != "ok"][:5]
        # The call A started and never finished ran once more on B (its intent was recorded, its result
        # was not); nothing ran a third time.
        assert log.read_text() == "run\nrun\n"
    finally:
        stop.touch()
        if load.poll() is None:
            load.kill()
            load.wait()
        survivor.stop()
        doomed.stop()


# ---------------------------------------------------------------- which runs a sweep takes, in-process


class _Service:
    """What heddle.server.recovery uses of the server: its metrics, what it serves, its slots, submit."""

    def __init__(self, digest: str) -> None:
        from heddle.server.metrics import Metrics

        self.metrics = Metrics(1)
        self.sealed = object()
        self.core = SimpleNamespace(digest=digest)
        self.admission = SimpleNamespace(draining=False, saturation=0.0)
        self.submitted: list[dict[str, Any]] = []

    def runs_release(self, digest: str) -> bool:
        return bool(digest == self.core.digest)

    async def submit(self, body: dict[str, Any], on_event: Any) -> Any:
        self.submitted.append(body)
        raise ApiError(429, "busy", "a test's server takes no run")


def _left(store: MemStore, sid: str, digest: str, owner: Owner | None) -> None:
    record = Record(id=sid, digest=digest, document="bundle 'b'", owner=owner,
                    pending=Pending("running", {}, None, Journal().as_json()))
    store.sessions[sid] = Stored(sid, 2, record.encode(), time.time() - 60)


def test_a_sweep_takes_only_runs_whose_owner_is_gone_on_the_bundle_it_serves() -> None:
    from heddle.server.recovery import Recovery

    gone = Owner("elsewhere", 4242, "0" * 16, time.time() - 1, "another machine")
    alive = replace(gone, until=time.time() + 3600)
    store = MemStore()
    _left(store, "dead-owner", "sha256:served", gone)
    _left(store, "live-owner", "sha256:served", alive)
    _left(store, "failed", "sha256:served", None)  # a run that failed waits for --resume
    _left(store, "other-bundle", "sha256:other", gone)
    service = _Service("sha256:served")
    recovery = Recovery(service, store, lease=30)  # type: ignore[arg-type]

    async def sweep() -> int:
        taken = await recovery.sweep()
        while recovery._active:  # the run it resumed, refused by this server's submit
            await asyncio.sleep(0.01)
        return taken

    assert asyncio.run(sweep()) == 1
    assert service.submitted == [{"session": "dead-owner", "resume": True}]
    scraped = generate_latest(service.metrics.registry).decode()
    assert metric(scraped, "heddle_sessions_unrecovered", 'reason="digest"') == 1


# ---------------------------------------------------------------- in-process replicas of one bundle


def _bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A bundle whose one tool marks each of its runs in a log: (bundle, log)."""
    log, tools = tmp_path / "log", tmp_path / "tools"
    write_script(tools, "mark", f"#!/bin/sh\ncat >/dev/null\necho run >> {log}\necho '{{\"x\": \"done\"}}'\n")
    flow = one_tool_flow("marked", "mark").write(tmp_path / "flow.json")
    return Path(heddle.seal(flow, tools_dir=tools, output=tmp_path / "marked.heddle").path), log


def _replica(tmp_path: Path, bundle: Path, store: str, **config: Any) -> Any:
    """A heddle-server's service of `bundle`, on the session store `store`, with a lease of 1s."""
    from heddle.format.trust import TrustPolicy
    from heddle.server.config import ServerConfig
    from heddle.server.served_bundle import open_served
    from heddle.server.service import Service
    from heddle.settings import RunSettings

    key = tmp_path / "session.key"
    if not key.exists():
        key.write_text(KEYED["HEDDLE_SESSION_KEY"])
        key.chmod(0o600)
    settings = RunSettings(session_store=store, session_db=tmp_path / "sessions.db", session_key=key, session_lease=1)
    made = ServerConfig(bundle=str(bundle), allow_unsigned=True, settings=settings, **config)
    return Service(made, sealed=open_served(made, TrustPolicy.from_names((), allow_unsigned=True)))


async def _orphan(service: Any) -> str:
    """A new session of `service` whose run's owner died on another machine, its lease expired."""
    from heddle.sessions.record import decode

    store = service.sessions
    sid = await service.new_session()
    stored = await store.get(sid)
    gone = Owner("elsewhere", 4242, "0" * 16, time.time() - 1, "another machine")
    left = replace(decode(sid, stored.data, store=""), owner=gone,
                   pending=Pending("running", {"x": 1}, None, Journal().as_json()))
    await store.replace(sid, left.encode(), version=stored.version)
    return str(sid)


def test_a_client_that_reconnects_gets_the_recovered_runs_outcome_as_its_last_frame(
        tmp_path: Path, monkeypatch: Any) -> None:
    from heddle.server import sessions
    from heddle.server.app import build_app

    monkeypatch.setattr(sessions, "FOLLOW_EVERY", 0.01)
    bundle, log = _bundle(tmp_path)
    service = _replica(tmp_path, bundle, "sqlite", recover=True)

    async def main() -> list[tuple[str, Any]]:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
                sid = (await client.post("/v1/sessions")).json()["session"]
                nothing = await client.get(f"/v1/sessions/{sid}/events")
                assert nothing.status_code == 409 and "has no run to follow" in nothing.text, nothing.text
                assert (await client.get("/v1/sessions/nobody/events")).status_code == 404
                sid = await _orphan(service)
                store, reads = service.sessions, []
                real_get = store.get

                async def counted(session_id: str) -> Any:
                    reads.append(session_id)
                    return await real_get(session_id)

                monkeypatch.setattr(store, "get", counted)

                async def recover() -> None:
                    while len(reads) < 4:  # the client follows the run before it is taken over
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.4)  # not written for a third of the lease: a sweep takes it
                    assert await service.recovery.sweep() == 1
                    while service.recovery._active:
                        await asyncio.sleep(0.01)

                recovering = asyncio.ensure_future(recover())
                followed = await client.get(f"/v1/sessions/{sid}/events")
                await recovering
                assert followed.status_code == 200 and followed.headers["content-type"].startswith("text/event-stream")
                return sse_frames(followed.text)
        finally:
            await service.aclose()

    frames = asyncio.run(main())
    assert frames[-1] == ("flow_complete", {"type": "flow_complete", "session": frames[-1][1]["session"],
                                            "outputs": {"x": "done"}, "recovered": True}), frames
    assert log.read_text() == "run\n"


def test_a_servers_session_run_appends_its_steps_rather_than_rewriting_its_record(tmp_path: Path) -> None:
    from heddle.server.app import build_app

    bundle, log = _bundle(tmp_path)
    service = _replica(tmp_path, bundle, "sqlite")
    sealed = service.sessions.store  # under the server's expiry: the store that seals records and steps
    written: list[str] = []

    def counting(name: str) -> Any:
        real = getattr(sealed, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            written.append(name)
            return real(*args, **kwargs)

        return counted

    for name in ("replace", "append_step"):
        setattr(sealed, name, counting(name))

    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
                sid = (await client.post("/v1/sessions")).json()["session"]
                ran = await client.post("/v1/runs", json={"session": sid, "inputs": {"x": 1}})
                assert ran.status_code == 200 and ran.json()["outputs"] == {"x": "done"}, ran.text
        finally:
            await service.aclose()

    asyncio.run(main())
    # The tool call's intent and result are appended between the StartNode's checkpoint and the end's write.
    assert written[0] == "replace" and written.count("append_step") == 2, written
    assert log.read_text() == "run\n"


# ---------------------------------------------------------------- two sweeps racing on one Postgres, in-process


def test_two_replicas_sweeping_at_once_resume_a_run_once(tmp_path: Path, postgres_dsn: str,
                                                        monkeypatch: Any) -> None:
    bundle, log = _bundle(tmp_path)
    store = fresh_schema(postgres_dsn)

    async def race() -> tuple[list[int], list[float]]:
        replicas = [_replica(tmp_path, bundle, store) for _ in range(2)]
        try:
            recoveries = [r.recovery for r in replicas]
            assert recoveries[0] is not None and recoveries[1] is not None  # on by default with Postgres
            sid = await _orphan(replicas[0])
            # Both read the run's record before either takes it over: a compare-and-swap decides.
            meet, reads = asyncio.Barrier(2), asyncio.Barrier(2)
            for replica in replicas:
                real_submit, sessions = replica.submit, replica.sessions
                real_get = sessions.get
                taking = {"on": False}

                async def gated_get(session_id: str, real_get: Any = real_get, taking: Any = taking) -> Any:
                    found = await real_get(session_id)
                    if taking["on"]:
                        taking["on"] = False
                        await asyncio.wait_for(reads.wait(), 30)
                    return found

                async def gated(body: dict[str, Any], on_event: Any, real_submit: Any = real_submit,
                                taking: Any = taking) -> Any:
                    await asyncio.wait_for(meet.wait(), 30)  # both sweeps chose the run
                    taking["on"] = True
                    return await real_submit(body, on_event)

                monkeypatch.setattr(sessions, "get", gated_get)
                monkeypatch.setattr(replica, "submit", gated)
            await asyncio.sleep(0.5)  # not written for a third of the lease: a sweep looks at it
            found = list(await asyncio.gather(*(r.sweep() for r in recoveries)))
            while any(r._active for r in recoveries):
                await asyncio.sleep(0.01)
            shown = await replicas[1].session_summary(sid)
            assert shown["last"] == {"outputs": {"x": "done"}, "recovered": True}, shown
            return found, [r.recovered.labels("ok")._value.get() for r in recoveries]
        finally:
            for replica in replicas:
                await replica.aclose()

    found, oks = asyncio.run(race())
    assert found == [1, 1] and sorted(oks) == [0, 1], (found, oks)  # both tried; one finished it
    assert log.read_text() == "run\n"


def test_a_sweep_pages_through_the_store_and_then_reads_only_what_was_written_since(
        tmp_path: Path, monkeypatch: Any) -> None:
    from heddle.server import recovery
    from heddle.sessions import sqlite

    class Counted(sqlite.SqliteStore):
        """What a sweep reads of the store: the pages it lists, and the records it opens."""

        pages: list[int]
        got: list[str]

        async def index(self) -> Any:
            raise AssertionError("a sweep lists the store a page at a time")

        async def index_page(self, **kwargs: Any) -> Any:
            page = await super().index_page(**kwargs)
            self.pages.append(len(page))
            return page

        async def get(self, session_id: str) -> Any:
            self.got.append(session_id)
            return await super().get(session_id)

    clock = SimpleNamespace(now=1_000_000.0)
    monkeypatch.setattr(sqlite, "time", SimpleNamespace(time=lambda: clock.now))  # the time of each write
    monkeypatch.setattr(recovery, "time", SimpleNamespace(time=lambda: clock.now))
    monkeypatch.setattr(recovery, "PAGE", 50)
    store = Counted(tmp_path / "sessions.db")
    store.pages, store.got = [], []
    gone = Owner("elsewhere", 4242, "0" * 16, time.time() - 1, "another machine")

    def idle(sid: str) -> bytes:
        return Record(id=sid, digest="sha256:served", document="bundle 'b'").encode()

    def dead(sid: str) -> bytes:
        return Record(id=sid, digest="sha256:served", document="bundle 'b'", owner=gone,
                      pending=Pending("running", {}, None, Journal().as_json())).encode()
    service = _Service("sha256:served")
    sweeper = recovery.Recovery(service, store, lease=30)  # type: ignore[arg-type]

    async def sweep() -> int:
        store.pages.clear()
        store.got.clear()
        taken = await sweeper.sweep()
        while sweeper._active:
            await asyncio.sleep(0.01)
        return taken

    async def main() -> None:
        try:
            for n in range(120):
                clock.now += 1
                await store.create(f"idle-{n:03}", idle(f"idle-{n:03}"))
            await store.create("dead-1", dead("dead-1"))
            clock.now += 60
            # The first look reads every session once, a page at a time.
            assert await sweep() == 1 and store.pages == [50, 50, 21] and len(store.got) == 121
            # Then only what was written since (and the margin before it): here, one dead run more.
            await store.create("dead-2", dead("dead-2"))
            clock.now += 60
            assert await sweep() == 1 and store.got == ["dead-2"], store.got
            assert service.submitted == [{"session": "dead-1", "resume": True}, {"session": "dead-2", "resume": True}]
        finally:
            await store.close()

    asyncio.run(main())
