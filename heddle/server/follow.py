"""A server that follows a tag: `heddle-server --bundle oci://REGISTRY/REPO:TAG --pull-interval 5m`.

At start the tag is resolved and its bundle verified before the port opens, as for any
`--bundle`. Then, every interval, the tag is resolved again; a digest other than the one served
is pulled, verified against the trust the shell built at start (the same `open_served` as at
start) and prepared as a whole new edition, all in a worker thread, and swapped in on the event
loop between requests (heddle.server.edition): runs in flight finish on the bundle they started
with, the next runs get the new one.

A new digest is served only when it verifies, is the same agent (the sealed flow's name and id, or
the name `--expect-name` gives) and is later than the one served: signed after it and, where both
carry a release number, of a higher release (heddle.format.release). So a tag put back on an older
bundle the same key once signed (a rollback), or on another agent signed by the same key (a
substitution), is refused. A digest that fails is refused: the served one stays (and /readyz with
it), and the refusal (when, which digest, why) is kept for /metrics and GET /v1/capabilities. A
refused digest is not pulled again while the tag stays on it: trust does not change while the server
runs, and what is served only moves forward. A registry that cannot be reached, answers an error, or
sends a download that is not the digest it stated (corrupted, cut short, over a cap) is tried again
on the next interval: what a digest names never changes, but one bad transfer says nothing of the
next. A session bound to a bundle the server does not serve (begun on a replica that pulled the new
release first) has it look at once (`catch_up`). The loop stops when the server starts draining.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from heddle.errors import HeddleError
from heddle.format.release import DowngradeError, Stamp, refusal

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy
    from heddle.oci import Resolved
    from heddle.server.config import ServerConfig
    from heddle.server.edition import Edition
    from heddle.server.service import Service

log = logging.getLogger("heddle.server")


class Refused(Exception):
    """A digest that cannot be served: its bundle did not verify, or this server cannot run it.
    Raised by a Source's `pull`, with the error that says why as its cause."""

    def __init__(self, cause: HeddleError) -> None:
        super().__init__(cause.message)
        self.cause = cause


class Source(Protocol):
    """Where a following server's bundles come from. Both calls block (network, verification)."""

    reference: str

    def check(self) -> str:
        """The digest the tag names now; raises on a registry that cannot answer."""
        ...

    def pull(self, digest: str) -> Edition:
        """That digest fetched, verified and prepared as an edition; Refused when it cannot be served,
        any other error when the registry could not be read."""
        ...


def open_edition(config: ServerConfig, trust: TrustPolicy, service: Service, path: Path, digest: str, *,
                 name: str | None = None) -> Edition:
    """The bundle at `path` (fetched for `digest`) opened as at start-up and prepared whole; Refused
    when it does not verify or cannot be served, its message naming the file as `name` (the
    reference it was pulled by) rather than as the cache's file. Blocking."""
    from heddle.oci import Pulled
    from heddle.server.edition import build_edition
    from heddle.server.served_bundle import close_served, open_served

    def refused(exc: HeddleError) -> Refused:
        if name is not None and str(path) in exc.message:
            exc = copy.copy(exc)
            exc.message = exc.message.replace(str(path), name)
            exc.args = (exc.message,)
        return Refused(exc)

    try:
        sealed = open_served(config, trust, Pulled(path, config.bundle, digest))
    except HeddleError as exc:
        raise refused(exc) from exc
    try:
        edition = build_edition(config, service.policy, sealed, service.metrics.observer(from_request=False))
    except BaseException as exc:
        close_served(sealed)
        if isinstance(exc, HeddleError):
            raise refused(exc) from exc
        raise
    edition.oci_digest = digest
    return edition


class OciSource:
    """A tag of an OCI registry, resolved and pulled with heddle.oci. A digest is fetched exactly as it
    was resolved (no second resolution), so what is verified is what was checked, even if the tag
    moves meanwhile."""

    def __init__(self, reference: str, *, config: ServerConfig, trust: TrustPolicy, service: Service,
                 plain_http: bool = False) -> None:
        self.reference = reference
        self._config = config
        self._trust = trust
        self._service = service
        self._plain_http = plain_http
        self._resolved: Resolved | None = None

    def check(self) -> str:
        from heddle import oci
        from heddle.format.errors import BundleError

        try:
            self._resolved = oci.resolve(self.reference, plain_http=self._plain_http,
                                         timeout=self._config.transfer_timeout)
        except BundleError as exc:  # the tag names an artifact that is not a heddle bundle
            raise Refused(exc) from exc
        return self._resolved.oci_digest

    def pull(self, digest: str) -> Edition:
        from heddle import oci

        resolved = self._resolved
        assert resolved is not None and resolved.oci_digest == digest, "pull follows the check that found it"
        # A download that fails, or is not the blob the digest names, is an error of this transfer: it
        # raises as it is, and the digest is tried again on the next interval.
        path = oci.fetch(resolved, plain_http=self._plain_http, timeout=self._config.transfer_timeout)
        return open_edition(self._config, self._trust, self._service, path, digest, name=str(resolved.pinned))


@dataclass(frozen=True)
class Event:
    """A refusal or a registry error, as /v1/capabilities shows it."""

    time: float
    reason: str
    kind: str
    digest: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time": _stamp(self.time)}
        if self.digest is not None:
            out["ociDigest"] = self.digest
        out.update(reason=self.reason, kind=self.kind)
        return out


def _stamp(when: float) -> str:
    """RFC 3339, in UTC, to the millisecond."""
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class _Outcome:
    digest: str | None = None
    edition: Edition | None = None
    refused: HeddleError | None = None
    failed: BaseException | None = None

    def discard(self) -> None:
        if self.edition is not None:
            self.edition.close_unused()


def _say(message: str) -> None:
    from heddle.textsafe import write_line

    write_line(sys.stderr, f"heddle-server: {message}")


class Follower:
    """The loop that re-resolves the tag every `interval` seconds and swaps in what verifies."""

    def __init__(self, service: Service, source: Source, *, interval: float, digest: str,
                 expect_name: str | None = None) -> None:
        self.service = service
        self.source = source
        self.interval = interval
        self.digest = digest  # the OCI digest served
        self.expect_name = expect_name
        self.stamp = stamp_of(service.edition.sealed)  # what orders the bundle served
        self.refused: dict[str, Event] = {}
        self.last_refusal: Event | None = None
        self.last_error: Event | None = None
        self.last_check: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._looking = asyncio.Lock()  # one round at a time: the interval's, or one a session asked for
        # Bundle digests a session named that a look asked for did not bring: not asked for again until a swap.
        self._sought: dict[str, None] = {}

    def start(self) -> None:
        """Start following (on the server's loop, once it listens)."""
        if self._task is None:
            self._task = self.service.tasks.start(self._follow(), name="heddle-follow")

    def stop(self) -> None:
        """Stop following: a pull under way finishes in its thread and is thrown away."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            async with self._looking:
                self._apply(await self._round())

    async def catch_up(self, bundle_digest: str) -> None:
        """Look at the tag now, for a session bound to a bundle this server does not serve: a release
        pushed since the last look, which another replica already serves. Once per bundle digest until
        the next swap, so that sessions of a bundle the tag never names (another agent's, or a release
        this server let go) cost one look; a request that comes while a look is under way waits for it."""
        if self._task is None or self._task.done():
            return
        first = bundle_digest not in self._sought
        if first:
            self._sought[bundle_digest] = None
            while len(self._sought) > 64:
                del self._sought[next(iter(self._sought))]
        async with self._looking:
            if first:
                try:
                    self._apply(await self._round())
                except BaseException:
                    # A look that did not end (its caller gone, say) was no look: the next session asks again.
                    self._sought.pop(bundle_digest, None)
                    raise

    async def _round(self) -> _Outcome:
        """One check (and pull) in a thread of its own, so the loop never waits on the registry or the
        verifier. A daemon thread: a registry that hangs does not hold the server's exit."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_Outcome] = loop.create_future()

        def deliver(outcome: _Outcome) -> None:
            if done.cancelled():
                outcome.discard()
            else:
                done.set_result(outcome)

        def work() -> None:
            outcome = _Outcome(failed=RuntimeError("the check stopped before it answered"))
            try:
                outcome = self._work()
            finally:
                answer(outcome)

        def answer(outcome: _Outcome) -> None:
            try:
                loop.call_soon_threadsafe(deliver, outcome)
            except RuntimeError:  # the loop has closed: the server stopped meanwhile
                outcome.discard()

        threading.Thread(target=work, name="heddle-follow", daemon=True).start()
        try:
            return await done
        except asyncio.CancelledError:
            if done.done() and not done.cancelled():
                done.result().discard()
            raise

    def _work(self) -> _Outcome:
        # Whatever goes wrong is reported and tried again next round: a follower that died of it would
        # leave the server serving an old digest while saying it follows the tag.
        try:
            digest = self.source.check()
        except Refused as exc:
            return _Outcome(refused=exc.cause)
        except Exception as exc:  # noqa: BLE001
            return _Outcome(failed=exc)
        if digest == self.digest or digest in self.refused:
            return _Outcome(digest=digest)
        try:
            edition = self.source.pull(digest)
            why = refusal(stamp_of(edition.sealed), self.stamp, expect_name=self.expect_name)
            if why is not None:
                edition.close_unused()
                raise Refused(DowngradeError(f"{why} (the bundle served is {self.stamp.digest}, "
                                             f"{self.stamp.when()})"))
            return _Outcome(digest=digest, edition=edition)
        except Refused as exc:
            return _Outcome(digest=digest, refused=exc.cause)
        except Exception as exc:  # noqa: BLE001
            return _Outcome(digest=digest, failed=exc)

    def _apply(self, outcome: _Outcome) -> None:
        """On the loop: swap in what verified, or keep what is served and say why."""
        now = time.time()
        self.last_check = now
        if outcome.failed is not None:
            error = outcome.failed
            message = error.message if isinstance(error, HeddleError) else f"{type(error).__name__}: {error}"
            if not isinstance(error, HeddleError):
                log.error("following %s failed unexpectedly", self.source.reference, exc_info=error)
            if self.last_error is None or self.last_error.reason != message:
                _say(f"warning: cannot check {self.source.reference} ({message}); still serving {self.digest}, "
                     f"trying again in {_duration(self.interval)}")
            kind = error.kind if isinstance(error, HeddleError) else "internal_error"
            self.last_error = Event(now, message, kind, outcome.digest)
            self.service.metrics.pull_failed()
            return
        self.last_error = None
        if outcome.refused is not None:
            self._refuse(outcome.digest, outcome.refused, now)
            return
        if outcome.edition is None:
            return
        assert outcome.digest is not None
        self.service.swap(outcome.edition)
        self._sought.clear()
        self.digest = outcome.digest
        sealed = outcome.edition.sealed
        assert sealed is not None, "a following server serves a bundle"
        self.stamp = stamp_of(sealed)
        _say(f"serving bundle {sealed.name!r} {sealed.digest} ({self.source.reference} at {self.digest})")

    def _refuse(self, digest: str | None, error: HeddleError, now: float) -> None:
        if digest is None and self.last_refusal is not None and self.last_refusal.digest is None \
                and self.last_refusal.reason == error.message:
            return  # the tag still names the same artifact that is no bundle: said once
        refusal = Event(now, error.message, error.kind, digest)
        if digest is not None:
            self.refused[digest] = refusal
        self.last_refusal = refusal
        self.service.metrics.bundle_refused(digest or "", error.kind, now)
        at = f" at {digest}" if digest is not None else ""
        _say(f"refused {self.source.reference}{at}: {error.message}; still serving {self.digest}")

    def describe(self) -> dict[str, Any]:
        """What GET /v1/capabilities says of the following."""
        out: dict[str, Any] = {"reference": self.source.reference, "pullIntervalMs": round(self.interval * 1000),
                               "ociDigest": self.digest,
                               "lastRefusal": self.last_refusal.as_json() if self.last_refusal else None,
                               "lastError": self.last_error.as_json() if self.last_error else None}
        if self.last_check is not None:
            out["lastCheck"] = _stamp(self.last_check)
        return out


def stamp_of(sealed: Bundle | None) -> Stamp:
    """What orders a served bundle: its digest, signing time and release, and its flow's name and id."""
    assert sealed is not None, "a following server serves a bundle"

    return Stamp(sealed.digest, sealed.signed_at, sealed.manifest.release, sealed.flow.name,
                 sealed.flow.id or None)


def _duration(seconds: float) -> str:
    from heddle.settings import SERVER

    return SERVER.duration(seconds)
