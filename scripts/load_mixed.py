"""A mixed load against a server that is already running (`scripts/load --url URL`), as a fleet's clients
send it: stateless runs, conversations (session turns, one session kept for many turns) and durable
runs (a session run whose input says "durable", which the rehearsal's tool makes last a while).

Each request carries an `x-request-id` (HAProxy logs it: scripts/fleet finds where each failed request
went), and each outcome is noted under the current phase with its latency and the version it answered
(`outputs.v`, when the flow answers one). A run in a session whose connection broke is noted, so that it
can be read back from its session afterwards (`read_back`)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

KINDS = ("stateless", "session", "durable")
# Turns of one conversation at most; the rehearsal ends conversations sooner (new_conversations).
TURNS = 500


@dataclass
class Outcome:
    phase: str
    kind: str  # stateless, session, durable
    started: float
    seconds: float
    cause: str  # "ok", or why it failed
    request_id: str = ""
    version: int | None = None
    session: str | None = None
    conversation: int = 0  # the conversation's number, for the session kind


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Mixed:
    """Mixed requests through one URL on `workers` threads (each a kind, in turn), until the context exits."""

    def __init__(self, url: str, workers: int = 6, *, inputs: Callable[[str], dict[str, Any]] | None = None) -> None:
        self.url, self.workers = url, workers
        self.inputs = inputs or (lambda kind: {"x": kind})
        self.phase = "warm-up"
        self.outcomes: list[Outcome] = []
        self.marks: dict[str, float] = {}
        self.lost: dict[str, int] = {}  # sessions whose run's connection broke, with the turns they had answered
        self.messages: dict[str, str] = {}  # one answer's body for each cause of failure
        self._generation = 0  # conversations begun under an older one end at their next turn
        self._conversations: dict[int, int] = {}  # worker -> the generation of its conversation
        self._ids = itertools.count(1)
        self._numbers = itertools.count(1)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, args=(n,), daemon=True) for n in range(workers)]

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    # ------------------------------------------------------------------ what the rehearsal asks

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    def wait_for(self, seen: Callable[[Outcome], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(seen(o) for o in list(self.outcomes)):
            if time.monotonic() > deadline:
                raise TimeoutError("the load never saw what it waited for")
            time.sleep(0.02)

    def new_conversations(self, timeout: float = 60.0) -> None:
        """End every conversation going on (at its next turn) and wait until each has."""
        with self._lock:
            self._generation += 1
            generation = self._generation
        deadline = time.monotonic() + timeout
        while any(g < generation for g in list(self._conversations.values())) and time.monotonic() < deadline:
            time.sleep(0.02)

    def conversations(self) -> dict[int, list[Outcome]]:
        """Each conversation's turns that answered."""
        out: dict[int, list[Outcome]] = {}
        for o in self.outcomes:
            if o.kind == "session" and o.cause == "ok":
                out.setdefault(o.conversation, []).append(o)
        return out

    def read_back(self, url: str, *, deadline: float) -> dict[str, dict[str, Any]]:
        """Each session whose run's connection broke, as GET /v1/sessions/{id} shows it once no run of it
        is going or left unfinished (another replica finished it, or it never began), or at the deadline."""
        import httpx

        out: dict[str, dict[str, Any]] = {}
        with httpx.Client(base_url=url, timeout=30) as client:
            for sid in self.lost:
                state: dict[str, Any] = {}
                while time.monotonic() < deadline:
                    try:
                        state = client.get(f"/v1/sessions/{sid}").json()
                    except (httpx.HTTPError, ValueError):
                        state = {}
                    if state.get("status") == "idle":  # finished (here or elsewhere), or never begun
                        break
                    time.sleep(0.1)
                last = state.get("last") or {}
                out[sid] = {"status": state.get("status"), "recovered": bool(last.get("recovered")),
                            "outputs": last.get("outputs"), "turns": state.get("turns"),
                            "turns_before": self.lost[sid]}
        return out

    # ------------------------------------------------------------------ the workers

    def _note(self, o: Outcome) -> None:
        with self._lock:
            self.outcomes.append(o)

    def _run(self, client: Any, kind: str, body: dict[str, Any], *, conversation: int = 0, turns: int = 0) -> Outcome:
        import httpx

        started = time.monotonic()
        rid = f"{kind}-{next(self._ids)}"
        sid = body.get("session")
        outcome = Outcome(self.phase, kind, started, 0.0, "ok", rid, session=sid, conversation=conversation)
        try:
            r = client.post("/v1/runs", json=body, headers={"x-request-id": rid})
        except httpx.HTTPError as exc:
            outcome.cause = f"connection lost ({kind})"
            with self._lock:
                self.messages[outcome.cause] = repr(exc)
        else:
            if r.status_code == 200:
                v = (r.json().get("outputs") or {}).get("v")
                outcome.version = v if isinstance(v, int) else None
            else:
                outcome.cause = f"HTTP {r.status_code} ({kind})"
                if r.status_code == 502:  # HAProxy's answer when the replica's connection broke first
                    outcome.cause = f"connection lost ({kind})"
                with self._lock:
                    self.messages[outcome.cause] = r.text[:300]
        outcome.seconds = time.monotonic() - started
        outcome.phase = self.phase  # where it ended: a run lost in a crash counts in the crash's phase
        if outcome.cause.startswith("connection") and sid is not None:
            with self._lock:
                self.lost[sid] = turns
        self._note(outcome)
        return outcome

    def _session(self, client: Any, kind: str) -> str | None:
        import httpx

        started = time.monotonic()
        rid = f"{kind}-session-{next(self._ids)}"
        try:
            made = client.post("/v1/sessions", headers={"x-request-id": rid})
        except httpx.HTTPError:
            self._note(Outcome(self.phase, kind, started, time.monotonic() - started,
                               f"connection lost ({kind}, new session)", rid))
            return None
        if made.status_code != 201:
            self._note(Outcome(self.phase, kind, started, time.monotonic() - started,
                               f"HTTP {made.status_code} ({kind}, new session)", rid))
            return None
        sid: str = made.json()["session"]
        return sid

    def _work(self, n: int) -> None:
        import httpx

        kind = KINDS[n % len(KINDS)]
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                if kind == "stateless":
                    self._run(client, kind, {"inputs": self.inputs(kind)})
                    continue
                generation = self._generation
                self._conversations[n] = generation
                sid = self._session(client, kind)
                if sid is None:
                    continue
                number = next(self._numbers)
                for turn in range(TURNS if kind == "session" else 1):
                    done = self._run(client, kind, {"session": sid, "inputs": self.inputs(kind)},
                                     conversation=number, turns=turn)
                    if done.cause != "ok" or self._stop.is_set() or self._generation != generation:
                        break


def table(outcomes: list[Outcome]) -> str:
    """Per phase: requests, failures by cause, p50/p99 of those that answered, versions answered."""
    lines = ["| phase | requests | failed | failures by cause | p50 ms | p99 ms | versions answered |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for phase in dict.fromkeys(o.phase for o in outcomes):
        mine = [o for o in outcomes if o.phase == phase]
        failed = Counter(o.cause for o in mine if o.cause != "ok")
        seconds = [o.seconds * 1000 for o in mine if o.cause == "ok"]
        answered = Counter(o.version for o in mine if o.version is not None)
        lines.append(f"| {phase} | {len(mine)} | {sum(failed.values())} | "
                     f"{', '.join(f'{c}: {k}' for c, k in failed.items()) or '-'} | "
                     f"{percentile(seconds, 0.5):.0f} | {percentile(seconds, 0.99):.0f} | "
                     f"{', '.join(f'v{v}: {k}' for v, k in sorted(answered.items())) or '-'} |")
    return "\n".join(lines)


def drive(url: str, *, seconds: float, workers: int) -> int:
    """`scripts/load --url URL`: the mixed load for `seconds`, then its table; 1 when a request failed."""
    with Mixed(url, workers=workers) as load:
        load.phase = "load"
        time.sleep(seconds)
    print(table(load.outcomes))
    for cause, body in load.messages.items():
        print(f"{cause}: {body}")
    return 1 if any(o.cause != "ok" for o in load.outcomes) else 0
