"""A session store in memory, for in-process tests of the session core (heddle.sessions.turn).

    store = MemStore()
    execute(loaded, session=SessionUse(store, "chat"), ...)
    assert store.writes == 1 and store.get("chat").version == 1

It keeps heddle.sessions.store's contract (compare-and-swap on the version, the size cap checked
before anything is written) and counts what was written, so that a test can say how many
checkpoints a run made. `before_get` runs in the store's calling thread before each read: two
racing turns meet there (a threading.Barrier) so that both read the same version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from heddle.sessions.store import Index, Stored, check_size, conflict, exists, not_found


class MemStore:
    name = "memory"

    def __init__(self, *, before_get: Callable[[], object] | None = None) -> None:
        self.sessions: dict[str, Stored] = {}
        self.writes = 0  # creates and replaces that were written
        self.before_get = before_get
        self._lock = threading.Lock()  # the run calls a store from worker threads

    def get(self, session_id: str) -> Stored | None:
        if self.before_get is not None:
            self.before_get()
        with self._lock:
            return self.sessions.get(session_id)

    def create(self, session_id: str, data: bytes) -> Stored:
        check_size(session_id, data, store=self.name)
        with self._lock:
            if session_id in self.sessions:
                raise exists(session_id, store=self.name)
            return self._put(Stored(session_id, 1, data, time.time()))

    def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
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

    def delete(self, session_id: str) -> bool:
        with self._lock:
            return self.sessions.pop(session_id, None) is not None

    def list(self) -> list[Stored]:
        with self._lock:
            return sorted(self.sessions.values(), key=lambda s: s.updated, reverse=True)

    def index(self) -> Index:
        with self._lock:
            return [(s.id, s.updated) for s in self.sessions.values()]

    def close(self) -> None:
        pass
