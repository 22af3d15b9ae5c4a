"""A session store in memory, for in-process tests of the session core (heddle.sessions.turn).

    store = MemStore()
    execute(loaded, session=SessionUse(store, "chat"), ...)
    assert store.writes == 1 and store.sessions["chat"].version == 1

It keeps heddle.sessions.store's contract (compare-and-swap on the version, the size cap checked
before anything is written) and counts what was written, so that a test can say how many
checkpoints a run made. `before_get` is awaited before each read (when it gives an awaitable): two
racing turns meet there (an asyncio.Barrier) so that both read the same version.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable

from heddle.sessions.store import Index, Stored, check_size, conflict, exists, not_found


class MemStore:
    name = "memory"

    def __init__(self, *, before_get: Callable[[], object] | None = None) -> None:
        self.sessions: dict[str, Stored] = {}
        self.writes = 0  # creates and replaces that were written
        self.steps_kept: dict[tuple[str, int], dict[int, bytes]] = {}
        self.before_get = before_get
        self._lock = threading.Lock()  # a test's threads may look at it too

    async def open(self) -> None:
        pass

    async def get(self, session_id: str) -> Stored | None:
        if self.before_get is not None:
            met = self.before_get()
            if inspect.isawaitable(met):
                await met
        with self._lock:
            return self.sessions.get(session_id)

    async def create(self, session_id: str, data: bytes) -> Stored:
        check_size(session_id, data, store=self.name)
        with self._lock:
            if session_id in self.sessions:
                raise exists(session_id, store=self.name)
            return self._put(Stored(session_id, 1, data, time.time()))

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_size(session_id, data, store=self.name)
        with self._lock:
            current = self.sessions.get(session_id)
            if current is None:
                raise not_found(session_id, store=self.name)
            if current.version != version:
                raise conflict(session_id, version, current.version, store=self.name)
            return self._put(Stored(session_id, version + 1, data, time.time()))

    def _put(self, stored: Stored) -> Stored:
        self.sessions[stored.id] = stored
        self.writes += 1
        return stored

    async def delete(self, session_id: str) -> bool:
        with self._lock:
            return self.sessions.pop(session_id, None) is not None

    async def list(self) -> list[Stored]:
        with self._lock:
            return sorted(self.sessions.values(), key=lambda s: s.updated, reverse=True)

    async def index(self) -> Index:
        with self._lock:
            return [(s.id, s.updated) for s in self.sessions.values()]

    async def close(self) -> None:
        pass

    # A durable run's steps (heddle.sessions.steps), kept apart from `writes`: by (session, base), seq -> line.
    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        with self._lock:
            kept = self.steps_kept.setdefault((session_id, base), {})
            if seq in kept:
                raise conflict(session_id, base, base, store=self.name)
            kept[seq] = data

    async def steps(self, session_id: str, base: int) -> list[tuple[int, bytes]]:
        with self._lock:
            return sorted(self.steps_kept.get((session_id, base), {}).items())

    async def drop_steps(self, session_id: str, below: int) -> None:
        with self._lock:
            for at in [at for at in self.steps_kept if at[0] == session_id and at[1] < below]:
                del self.steps_kept[at]
