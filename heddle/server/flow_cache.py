"""Request flows kept prepared, so that a flow sent again is not read and checked again.

What a request's flow becomes before it runs is a function of its document and of what the
server was started with: the typed flow (heddle.agentspec, the document reader's checks), its
preparation (heddle.engine.run.prepare_run: the graph, tool, plugin, sandbox and mount checks,
the model endpoints with the keys the model policy gives them) and the model policy's plan for it
(heddle.server.model_policy: what the document alone refuses, and which addresses to resolve).

The key covers every input of that function which a request can change:

- the document itself: the sha256 of its JSON as the request sent it (key order included: it
  reaches what runs, as the order of a tool's parameters that a model is shown): the very text
  of the body's `flow` member when the route read the body (heddle.server.body.read_json_members:
  no second pass over the document a request; and a text kept here is found by comparing it with
  the body's, `FlowCache.known`, and not read at all), or else its compact encoding; or of its text
  when it came as JSON or YAML text, or, for `flowPath`, of the file's bytes with its name (the
  name says its format and is in every message about it). A text and an encoding that are the
  same bytes are the same value, so they may share a key;
- the edition it was prepared on (heddle.server.edition: tools, tools folder, commands, plugins,
  node types, settings): an entry of another edition is never used.

What is never kept, because it can differ from one request to the next, and so is done for every
request, hit or not: the request's own fields, inputs and message (`check_run`, the refusal of a
document that may wait without a session); the model policy's address checks (names are resolved
again, the plan's refusals raised again); a request's own tools (their folder is new each time:
such a request is prepared afresh); the files a preparation looked at (each tool's executable bit,
the sandbox's --allow-read/--allow-write paths) are looked at again, and any change prepares the
flow afresh; mounts and tool files are checked again by every run as it starts (run_prepared).
A failure is never kept: a document that fails is read again when it comes again.

Bounded in entries and in the bytes of the documents kept, least recently used out first.
Entries are shared by concurrent runs, as the bundle's one prepared run is: nothing mutates them.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.engine.run import PreparedRun
    from heddle.server.model_policy import PolicyPlan

MAX_ENTRIES = 32
# Of document text: the typed flow and its preparation take some times more memory than this.
MAX_BYTES = 2 << 20
# A kept document's text is found by this many of its first characters, then compared whole.
_PREFIX = 64


@dataclass(frozen=True)
class KnownFlow:
    """A body's `flow` whose text is that of a kept entry (`FlowCache.known`): not read again, unless
    the entry is gone by the time it is looked up, or the text is another member's (`read_known`)."""

    text: str
    key: str

    def read(self) -> Any:
        from heddle.canonical import loads_strict

        return loads_strict(self.text)  # as the body's reading would have: its checks passed on this text


@dataclass
class Ready:
    """A request flow as read and prepared on one edition, or the failure of its preparation,
    raised once the request's own checks have passed (so a caller hears of them first, as before)."""

    flow: Flow
    edition: object
    run: PreparedRun | None = None
    failure: Exception | None = None
    plan: PolicyPlan | None = None  # None: a flow the operator put in --flows-root, not the policy's business
    # What the preparation found on disk, as (path, os.access mode): looked at again before each reuse.
    premises: tuple[tuple[str, int], ...] = ()
    size: int = 0
    _binding: str | None = field(default=None, repr=False)

    def binding(self) -> str:
        """The digest a session run of this flow is bound to (heddle.sessions.turn.flow_digest)."""
        if self._binding is None:
            from heddle.sessions.turn import flow_digest

            self._binding = flow_digest(self.flow)
        return self._binding

    def still_holds(self) -> bool:
        return all(os.access(path, mode) for path, mode in self.premises)


# json.dumps(value, separators=(",", ":"), allow_nan=False), its encoder made once, not per request; text
# left unescaped and no cycle looked for (a parsed document has none; a RecursionError ends one): a
# third less of what every request spends on its key.
_KEY_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False, check_circular=False)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def value_key(value: Any, text: str | None = None) -> tuple[str, int] | None:
    """The key and size of a request's `flow` (an object, or its JSON or YAML text); None for
    anything else, which is read (and refused) every time. `text`: the object as the request's
    JSON wrote it, which `value` was read from."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        return f"text:{_digest(data)}", len(data)
    if isinstance(value, dict) and text is not None:
        data = text.encode("utf-8", "surrogatepass")
        return f"object:{_digest(data)}", len(data)
    if isinstance(value, dict):
        try:
            data = _KEY_ENCODER.encode(value).encode("utf-8", "surrogatepass")
        except (ValueError, TypeError, RecursionError):
            return None
        return f"object:{_digest(data)}", len(data)
    return None


def file_key(name: str, data: bytes) -> str:
    """The key of a `flowPath` document: its name as the request wrote it, and its bytes."""
    return f"path:{_digest(name.encode('utf-8', 'surrogatepass'))}:{_digest(data)}"


def premises_of(flow: Flow, run: PreparedRun) -> tuple[tuple[str, int], ...]:
    """The files `prepare_run` found as they are for `run` to pass: the executables of the tools the
    flow names, and the paths the sandbox is told to allow."""
    from heddle.graph import referenced_tools

    found = [(str(run.tools[name]), os.X_OK) for name in sorted(referenced_tools(flow)) if name in run.tools]
    sandbox = run.options.sandbox
    if sandbox.safe:
        found += [(str(path), os.F_OK) for path in (*sandbox.allow_read, *sandbox.allow_write)]
    return tuple(found)


class FlowCache:
    """Ready flows by key, least recently used out first; safe to use from worker threads."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Ready] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # The texts of the entries kept from a body's `flow` member, by their first characters: each
        # value a tuple, replaced whole, so that `known` reads them on the loop without the lock.
        self._texts: dict[str, tuple[tuple[str, str], ...]] = {}
        self._text_of: dict[str, str] = {}

    def known(self, s: str, at: int) -> tuple[KnownFlow, int] | None:
        """A kept entry's text, when `s` has it at `at` (canonical.loads_strict_members's `known`): that
        text was read strictly before, and an object's text ends at its `}`, so reading it again would
        give the same value and end."""
        found = self._texts.get(s[at:at + _PREFIX])
        if found is not None:
            for text, key in found:
                if s.startswith(text, at):
                    return KnownFlow(text, key), at + len(text)
        return None

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, edition: object) -> Ready | None:
        """The entry of `key` prepared on `edition` whose files are still as they were, or None (and
        an entry that no longer fits is dropped)."""
        with self._lock:
            ready = self._entries.get(key)
            if ready is None:
                return None
            if ready.edition is edition:
                self._entries.move_to_end(key)
        if ready.edition is edition and ready.still_holds():
            return ready
        self._drop(key, ready)
        return None

    def put(self, key: str, ready: Ready, *, text: str | None = None) -> None:
        """Keep a flow whose preparation succeeded; failures and documents over the bound are not kept.
        `text`: the body's `flow` member it was read from, whose key `key` is (`known` finds it)."""
        if ready.run is None or ready.failure is not None or ready.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
                self._forget(key)
            self._entries[key] = ready
            self._bytes += ready.size
            if text is not None and len(text) >= _PREFIX:
                self._text_of[key] = text
                self._texts[text[:_PREFIX]] = (*self._texts.get(text[:_PREFIX], ()), (text, key))
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                gone, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.size
                self._forget(gone)

    def _forget(self, key: str) -> None:
        """The text index's entry of `key`, if any, removed (the lock held)."""
        text = self._text_of.pop(key, None)
        if text is None:
            return
        rest = tuple(entry for entry in self._texts[text[:_PREFIX]] if entry[1] != key)
        if rest:
            self._texts[text[:_PREFIX]] = rest
        else:
            del self._texts[text[:_PREFIX]]

    def _drop(self, key: str, ready: Ready) -> None:
        with self._lock:
            if self._entries.get(key) is ready:
                del self._entries[key]
                self._bytes -= ready.size
                self._forget(key)


def read_known(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as read with `FlowCache.known`, a kept text that was the value of a member other than
    `flow` read as any other value (only a `flow` is looked up by its text)."""
    for name, value in body.items():
        if isinstance(value, KnownFlow) and name != "flow":
            body[name] = value.read()
    return body


def read_ready(read: Callable[[], Flow], prepare: Callable[[Flow], PreparedRun] | None, *, edition: object,
               plan: Callable[[Flow], PolicyPlan] | None, size: int) -> Ready:
    """A flow read and, with `prepare`, prepared: the work of a cache miss, done in one worker thread.
    A failure to read is raised at once (it is the request's first answer); one to prepare is kept in
    the result, to be raised once the request's own checks have passed."""
    from heddle.server.model_policy import Refusal

    ready = Ready(read(), edition, size=size)
    try:
        if plan is not None:
            ready.plan = plan(ready.flow)
            if ready.plan and isinstance(ready.plan[-1], Refusal):
                # Refused by its text (a key or URL read from this server's environment...): never
                # prepared, as before, so that nothing of the environment is read for it.
                return ready
        if prepare is not None:
            ready.run = prepare(ready.flow)
            ready.premises = premises_of(ready.flow, ready.run)
    except Exception as exc:  # noqa: BLE001 - raised as it is, once the request's own checks pass
        ready.failure = exc
    return ready
