"""Finishing the session runs of a replica that died (`heddle-server --recover`).

Every session run on a server is durable, and its record names its owner and the lease the owner
renews while it runs (heddle.sessions.lease). A recovering server looks over the store every third of
the lease: a run whose owner no longer holds it (the lease expired, or on this host the process is
gone) is resumed here, from its checkpoint and steps, as `POST /v1/runs {"session": ID, "resume":
true}` would: through the same admission, run core and metrics. Taking it over is the store's
compare-and-swap on the record, so of the replicas that find it at once exactly one proceeds. A run
is resumed only on the bundle it started with (its session is bound to the bundle's digest), served or
kept for its sessions (Service.swap); a server that holds neither leaves it for one that does, and
counts it in /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from heddle.blocking import Tasks
from heddle.errors import HeddleError, SessionConflict, SessionError
from heddle.server.errors import ApiError

if TYPE_CHECKING:
    from heddle.server.config import ServerConfig
    from heddle.server.service import Service
    from heddle.sessions.store import SessionStore

log = logging.getLogger("heddle.server.recovery")

# The longest a sweep waits between two looks at the store, whatever the lease.
_MOST_EVERY = 10.0
# How many sessions a look lists at a time.
PAGE = 500


def recovers(config: ServerConfig) -> bool:
    """Whether the server recovers runs: --recover, or by default with a store replicas share."""
    if config.recover is not None:
        return config.recover
    return (config.settings.session_store or "").startswith(("postgres://", "postgresql://"))


class Recovery:
    """The loop that finds and finishes the runs a dead replica left (start/stop on the server's loop)."""

    def __init__(self, service: Service, store: SessionStore, *, lease: float) -> None:
        self.service = service
        self.store = store
        self.lease = lease
        self.every = min(lease / 3, _MOST_EVERY)
        # Where the last complete look ended: every session last written before it was looked at then.
        self._horizon: float | None = None
        # Sessions found with nothing to recover since the horizon's margin, by the time of the write seen.
        self._settled: dict[str, float] = {}
        # The runs the last look left (their owner holds them, another bundle, no free slot): looked at again.
        self._left: set[str] = set()
        self._looking = Tasks()
        self._runs = Tasks()  # the runs it resumed (each a run of the server's admission too)
        self._active: set[str] = set()  # the sessions being finished here
        registry = service.metrics.registry
        self.recovered = Counter(
            "heddle_sessions_recovered", "Session runs this server took over once their owner's lease expired, "
            "by outcome (ok, waiting, error).", ["outcome"], registry=registry)
        self.left = Gauge(
            "heddle_sessions_unrecovered", "Session runs whose owner's lease expired that this server leaves, at "
            "its last look, by reason (digest: it does not serve the bundle they started with).", ["reason"],
            registry=registry)
        self.left.labels("digest").set(0)

    def start(self) -> None:
        self._looking.start(self._loop(), name="recovery")

    async def stop(self) -> None:
        """Stop looking; the runs recovered so far go on as any run does (draining waits for them)."""
        await self._looking.aclose()

    async def aclose(self) -> None:
        """Stop looking, and end what is left of the runs it resumed (after a drain, none is)."""
        await self._looking.aclose()
        await self._runs.aclose()

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except (HeddleError, OSError) as exc:  # the store out of reach: the next sweep tries again
                log.warning("recovery: %s", " ".join(str(exc).split()))
            await asyncio.sleep(self.every)

    async def sweep(self) -> int:
        """One look over the store: the runs whose owner is gone, started here. Returns how many.

        It pages through the sessions not written for a third of the lease, in order of their last
        write, from a little before where the last complete look ended (a session written before that
        and not since was looked at then): after the first look, each reads only what was written
        meanwhile, and the runs it left (a live lease, another bundle, no free slot) once more."""
        from heddle.sessions.record import decode
        from heddle.sessions.store import index_page

        until = time.time() - self.lease / 3  # an owner renews at least this often
        # A write lands in the store a moment after its time is taken: the margin looks at it again.
        since = None if self._horizon is None else self._horizon - self.lease / 3
        self._settled = {sid: when for sid, when in self._settled.items() if since is None or when > since}
        left, kept = set(self._left), set[str]()
        started, elsewhere = 0, 0

        async def look(sid: str, updated: float | None) -> bool:
            """One session; False when the look stops here (the server drains)."""
            nonlocal started, elsewhere
            try:
                stored = await self.store.get(sid)
                record = decode(sid, stored.data, store=self.store.name) if stored is not None else None
            except SessionError:
                record = None  # unreadable: its owner (a person) removes it
            if record is None or not record.running or record.owner is None:
                if updated is not None:
                    self._settled[sid] = updated  # nothing runs, or a run that failed waits for --resume
                return True
            if record.owner.holds():
                kept.add(sid)
                return True
            if not self.service.runs_release(record.digest):
                elsewhere += 1
                kept.add(sid)
                return True
            if self.service.admission.draining:
                return False
            if self._start(sid):
                started += 1
            else:
                kept.add(sid)
            return True

        for sid in left:
            if not await look(sid, None):
                return started
        after: tuple[float, str] | None = None
        while True:
            page = await index_page(self.store, since=since, until=until, after=after, limit=PAGE)
            for sid, updated in page:
                if sid in left or self._settled.get(sid) == updated:
                    continue
                if not await look(sid, updated):
                    return started
            if len(page) < PAGE:
                break
            after = (page[-1][1], page[-1][0])
        self._horizon, self._left = until, kept
        self.left.labels("digest").set(elsewhere)
        return started

    def _start(self, sid: str) -> bool:
        """Resume `sid` as a run of this server; False when it has no slot for it now (the next sweep
        tries again)."""
        if sid in self._active or self.service.admission.saturation >= 1:
            return False
        self._active.add(sid)
        self._runs.start(self._finish(sid), name=f"recovery of session {sid}")
        return True

    async def _finish(self, sid: str) -> None:
        from dataclasses import replace

        from heddle.engine.events import ignore

        try:
            # The turn takes the run over before anything runs (its record and the steps since, with the
            # store's compare-and-swap: on Postgres `FOR UPDATE SKIP LOCKED`), so that of the replicas
            # that found it exactly one proceeds.
            try:
                submitted = await self.service.submit({"session": sid, "resume": True}, ignore)
            except (ApiError, HeddleError) as exc:
                log.info("recovery: session %s not taken over: %s", sid, " ".join(str(exc).split()))
                return
            # Its task has not begun (nothing was awaited since it was made): the turn it runs says that it
            # finishes another replica's run.
            if submitted.job.session is not None:
                submitted.job.session = replace(submitted.job.session, recovered=True)
            try:
                outcome = await submitted.outcome()
            except (ApiError, HeddleError) as exc:
                # Another replica took it first, or the run failed as any run may (the session says how).
                if not isinstance(exc, SessionConflict):
                    self.recovered.labels("error").inc()
                log.info("recovery: session %s: %s", sid, " ".join(str(exc).split()))
                return
            finally:
                await submitted.aclose()
            self.recovered.labels("waiting" if outcome.waiting is not None else "ok").inc()
            log.info("recovery: session %s finished here", sid)
        finally:
            self._active.discard(sid)
