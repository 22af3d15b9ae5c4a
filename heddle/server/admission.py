"""Which runs may start: a fixed number at once (the rest refused, never queued), none while draining.

Everything here runs on the server's one event loop, so counts need no lock.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from heddle.server.errors import ApiError

if TYPE_CHECKING:
    from heddle.server.metrics import Metrics


class Ticket:
    """One admitted run's slot. Released exactly once, however the run ends."""

    def __init__(self, owner: Admission) -> None:
        self._owner = owner
        self.task: asyncio.Task[object] | None = None
        self.released = False

    def attach(self, task: asyncio.Task[object]) -> None:
        """The task to cancel when the server stops waiting for this run."""
        self.task = task

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._owner._release(self)


class Admission:
    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.metrics = metrics
        self.draining = False
        self._tickets: set[Ticket] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        metrics.count_runs(lambda: len(self._tickets))

    @property
    def active(self) -> int:
        return len(self._tickets)

    @property
    def saturation(self) -> float:
        return self.active / self.limit

    def check_open(self, *, run: bool = True) -> None:
        """503 while draining, for a new run (counted) or a new session (`run` False)."""
        if self.draining:
            if run:
                self.metrics.run_rejected("draining")
            raise ApiError(503, "draining", f"the server is shutting down and takes no new "
                                            f"{'runs' if run else 'sessions'}; retry on another instance",
                           headers={"Retry-After": "1"})

    def admit(self) -> Ticket:
        """A slot for one run, or 503 while draining, or 429 when every slot is taken."""
        self.check_open()
        if self.active >= self.limit:
            self.metrics.run_rejected("busy")
            raise ApiError(429, "busy", f"all {self.limit} run slots are in use (--max-concurrent {self.limit}); "
                                        "retry later", headers={"Retry-After": "1"})
        ticket = Ticket(self)
        self._tickets.add(ticket)
        self._idle.clear()
        return ticket

    def _release(self, ticket: Ticket) -> None:
        self._tickets.discard(ticket)
        if not self._tickets:
            self._idle.set()

    def start_draining(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout: float | None) -> bool:
        """True once no run holds a slot; False if `timeout` seconds pass first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def cancel_all(self) -> int:
        """Cancel every admitted run still going; their tools' process groups are killed."""
        cancelled = 0
        for ticket in list(self._tickets):
            if ticket.task is not None and not ticket.task.done():
                ticket.task.cancel()
                cancelled += 1
        return cancelled
