"""What a durable run's steps cost, and the long form of the suite's chaos test. Prints markdown.

- a step's checkpoint (one sealed step appended: an intent or a result), p50 and p90, on the sqlite
  store and on a local Postgres (a throwaway cluster, when Postgres is installed);
- the bytes a durable agent run writes to its store for N tool calls (records and steps), against
  what rewriting the record at each step would write: linear in the steps, not quadratic;
- a durable run SIGKILLed 200 times at random moments and resumed (tests/sessions/chaos.py).

    python scripts/bench_steps.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEY = b"bench-session-key-" * 3


def _step(n: int) -> bytes:
    from heddle.sessions.steps import step_line

    entry = {"type": "tool_done", "call": "tool", "name": "tick", "fingerprint": "sha256:" + "0" * 64,
             "output": {"m": n, "text": "x" * 200}}
    return step_line("0" * 32, f"/worker#1/{n}t", entry)


async def _append_times(store: Any, steps: int) -> list[float]:
    from heddle.sessions.seal import SealedStore

    sealed = SealedStore(store, KEY)
    sid = f"bench-{random.randrange(1 << 30)}"
    await sealed.create(sid, b'{"bench":true}')
    times = []
    for seq in range(1, steps + 1):
        started = time.perf_counter()
        await sealed.append_step(sid, 1, seq, _step(seq))
        times.append(time.perf_counter() - started)
    await sealed.drop_steps(sid, 2)
    await sealed.delete(sid)
    return times


def _row(where: str, times: list[float], aim_ms: float) -> str:
    ordered = sorted(times)
    p50, p90 = ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.9)] * 1000
    verdict = "met" if p50 <= aim_ms else "missed"
    return f"| {where} | {p50:.2f} ms | {p90:.2f} ms | {len(times)} | within {aim_ms:g} ms: {verdict} |"


def bench_checkpoints(steps: int) -> list[str]:
    from heddle.sessions.sqlite import SqliteStore

    rows = ["| store | a step's checkpoint, p50 | p90 | steps | aim |", "|---|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(Path(folder) / "sessions.db")
        rows.append(_row("sqlite (WAL, synchronous=FULL: each step fsynced)", asyncio.run(_append_times(store, steps)),
                         2))
        asyncio.run(store.close())
    try:
        from tests.support.postgres import _bindir, throwaway_cluster
    except ImportError:
        _bindir = None  # type: ignore[assignment]
    if _bindir is None or _bindir() is None:
        rows.append("| Postgres | not measured: Postgres is not installed | | | within 10 ms |")
        return rows
    from heddle.sessions.postgres import PostgresStore

    with throwaway_cluster() as dsn:
        pg = PostgresStore(dsn)

        async def measured() -> list[float]:
            try:
                return await _append_times(pg, steps)
            finally:
                await pg.close()

        rows.append(_row("Postgres (local, a unix socket)", asyncio.run(measured()), 10))
    return rows


def bench_bytes(counts: list[int]) -> list[str]:
    """A durable agent run of N tool calls, in-process (the scripted model through ASGITransport)."""
    from heddle.runs import execute, from_document
    from heddle.sessions.turn import SessionUse
    from heddle.settings import RunSettings
    from tests.support.flows import llm_config, server_tool, write_script
    from tests.support.inproc import URL, served_model
    from tests.support.memstore import MemStore

    class Counting(MemStore):
        def __init__(self) -> None:
            super().__init__()
            self.record_bytes = self.step_bytes = self.record_size = 0

        async def create(self, session_id: str, data: bytes) -> Any:
            self.record_bytes += len(data)
            self.record_size = len(data)  # the first checkpoint's: the record before any step
            return await super().create(session_id, data)

        async def replace(self, session_id: str, data: bytes, *, version: int) -> Any:
            self.record_bytes += len(data)
            return await super().replace(session_id, data, version=version)

        async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
            self.step_bytes += len(data)
            await super().append_step(session_id, base, seq, data)

    rows = [("| tool calls | steps | bytes written (records + steps) | per step | rewriting the record at each "
             "step would write |"), "|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as folder:
        tools = Path(folder) / "tools"
        write_script(tools, "tick.sh", '#!/bin/sh\ncat >/dev/null\nprintf \'{"m": 1}\'\n')
        tick = server_tool("tick", [{"title": "n", "type": "integer"}], [{"title": "m", "type": "integer"}])
        doc = Path(folder) / "agent.json"
        doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                                   "llm_config": llm_config(URL), "system_prompt": "You tick.", "tools": [tick]}))
        for n in counts:
            script = [{"tool_calls": [{"name": "tick", "arguments": {"n": i}}]} for i in range(n)]
            store = Counting()
            with served_model([*script, {"content": "done"}]) as model:
                loaded = from_document(doc, RunSettings(max_tool_rounds=n + 1), tools_dir=tools)
                asyncio.run(execute(loaded, message="go", transport=model.transport,
                                    session=SessionUse(store, "s", durable=True)))
            steps = 4 * n + 2  # an intent and a result for each model call (n + 1) and tool call (n)
            total = store.record_bytes + store.step_bytes
            # Each step rewriting the whole record, which grows by a step's bytes each time.
            per_step = store.step_bytes / steps
            quadratic = sum(store.record_size + i * per_step for i in range(1, steps + 1))
            rows.append(f"| {n} | {steps} | {total:,} | {total / steps:,.0f} | {quadratic:,.0f} |")
    return rows


def bench_chaos(kills: int, calls: int) -> list[str]:
    from tests.sessions.chaos import check, run_chaos
    from tests.sessions.support import SESSION_KEY
    from tests.support.cli import env_with

    seed = random.randrange(1 << 30)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        # A killed run leaves its workspaces behind: in this folder, removed with it.
        homes = {name: str(root / name.lower()) for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
                                                             "TMPDIR")}
        (root / "tmpdir").mkdir()
        (root / "run").mkdir()
        started = time.perf_counter()
        done = run_chaos(root / "run", kills=kills, calls=calls, seed=seed,
                         env=env_with({"HEDDLE_SESSION_KEY": SESSION_KEY, **homes}))
        check(done, calls)
        took = time.perf_counter() - started
    repeated = sum(len(lines) for lines in done.runs) - calls
    return [(f"A durable agent run of {calls} tool calls, SIGKILLed {done.kills} times at random moments (seed "
             f"{seed}) and resumed each time, in {took:.1f} s: no completed call ran again; {repeated} calls whose "
             "result a kill lost ran again, each once and with its earlier idempotency key; the outputs equal those "
             "of the same run never killed.")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and kills")
    args = ap.parse_args()
    os.environ.setdefault("HEDDLE_SESSION_KEY", KEY.decode())
    steps = 50 if args.quick else 300
    kills = 20 if args.quick else 200
    out = [("Produced by `python scripts/bench_steps.py` (run by `scripts/bench`). A step is an intent or a "
            "result, sealed (HMAC-SHA256 under the session key) and appended beside the record; each is in the "
            "store before the run goes on."), ""]
    out += [*bench_checkpoints(steps), ""]
    out += [*bench_bytes([10, 20, 40, 80]), ""]
    out += bench_chaos(kills, max(40, kills * 3 // 2))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
