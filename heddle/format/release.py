"""Whether one bundle may follow another under the same name (a tag, a URL): the order of releases.

A bundle's place in time is the `signed_at` its signatures seal (heddle.format.signing) and, when
the packer gave one, the manifest's `release`. A bundle may replace the one seen before it only
when it is the same agent and later: signed after it and, where both carry a release number, of a
higher release. Anything else is a rollback (an older bundle the same key once signed, put back
under the name) or a substitution (another agent signed by the same key), the attacks TUF calls
rollback and mix-and-match; it is refused unless the caller explicitly accepts it.

A time no signature states is unknown and earlier than every known time; two unknown times do not
order the bundles (so bundles signed before times were sealed keep following each other, as they
always did), and the release numbers, where both have one, still do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heddle.format.errors import BundleError
from heddle.format.signing import Signatures, is_stamp


class DowngradeError(BundleError):
    """A bundle older than, or another agent than, the one seen before under the same name."""

    exit_code = 11
    kind = "downgrade"


@dataclass(frozen=True)
class Stamp:
    """What orders a bundle: its digest, when it was signed, its release, and which agent it is."""

    digest: str  # the bundle's own digest, sha256:<hex>
    signed_at: str | None
    release: int | None
    name: str
    agent_id: str | None = None  # the flow's id, where the sealed flow was read

    def as_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "signed_at": self.signed_at, "release": self.release, "name": self.name,
                "agent_id": self.agent_id}

    @classmethod
    def from_json(cls, data: object) -> Stamp | None:
        """A stamp read back, or None when `data` is not one (a damaged record proves nothing)."""
        if not isinstance(data, dict):
            return None
        digest, at, release, name, agent = (data.get(k) for k in ("digest", "signed_at", "release", "name",
                                                                   "agent_id"))
        if not isinstance(digest, str) or not isinstance(name, str) or (at is not None and not is_stamp(at)):
            return None
        if release is not None and (not isinstance(release, int) or isinstance(release, bool)):
            return None
        if agent is not None and not isinstance(agent, str):
            return None
        return cls(digest, at, release, name, agent)

    def when(self) -> str:
        """For messages: the release and the time."""
        at = f"signed {self.signed_at}" if self.signed_at is not None else "signed at an unknown time"
        return f"release {self.release}, {at}" if self.release is not None else at


def lower_bound(signatures: Signatures) -> str | None:
    """The earliest time any signature claims, or None when one claims none: read without trust, so only
    a bound an attacker can lower (which refuses) but never raise past a signature that verifies."""
    times = [s.signed_at for s in signatures.signatures]
    if not times or any(t is None for t in times):
        return None
    return min(t for t in times if t is not None)


def refusal(new: Stamp, old: Stamp, *, expect_name: str | None = None) -> str | None:
    """Why `new` may not replace `old`, or None when it may. With `expect_name`, the agent is the one of
    that name, whatever `old` was; without it, the one `old` was (its name, and its flow id where both
    are known)."""
    if new.digest == old.digest:
        return None
    if expect_name is not None:
        if new.name != expect_name:
            return f"it is agent {new.name!r}, not {expect_name!r} as --expect-name says"
    elif new.name != old.name:
        return f"it is agent {new.name!r}, not {old.name!r} as before (another agent under the same name)"
    elif new.agent_id is not None and old.agent_id is not None and new.agent_id != old.agent_id:
        return f"its flow id is {new.agent_id!r}, not {old.agent_id!r} as before (another agent of the same name)"
    if new.release is not None and old.release is not None and new.release <= old.release:
        return f"it is {new.when()}, not a release after {old.when()}"
    if old.signed_at is not None and (new.signed_at is None or new.signed_at <= old.signed_at):
        return f"it is {new.when()}, not signed after {old.when()}"
    return None
