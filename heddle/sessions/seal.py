"""Session records, authenticated: whoever can write a store but lacks the key cannot forge what a
session holds (its results, answers and approvals).

A store keeps each record sealed, as canonical JSON:

    {"mac":"hmac-sha256:<hex>","record":<the record, verbatim>}

The MAC is HMAC-SHA256, under the session key, of the session's id, the version the write makes
and the record's bytes: a record moved to another session, or put back at another version than
the one it was written at, fails the check as an edited one does. What it cannot tell is a whole
row put back as it was (an older record at its own, older version): see docs/sessions.md.

The key is kept apart from the records. `--session-key FILE` or `$HEDDLE_SESSION_KEY` give it (the
operator gives every replica sharing a store the same); without them the sqlite and file stores use
a key file in heddle's own config folder ($XDG_CONFIG_HOME/heddle/session.key, made 0600 on first
use), and a Postgres or plugin store is refused: a default there would be a key every replica made
up for itself.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from heddle.errors import SessionUnreadable, UsageError
from heddle.format.private import make_private_dir
from heddle.secret_env import SESSION_KEY as ENV_SESSION_KEY
from heddle.sessions.private import config_home
from heddle.sessions.steps import MAX_STEP_BYTES, StepLog
from heddle.sessions.store import MAX_SESSION_BYTES, Index, SessionStore, Stored, check_size, index_page

KEY_FILE = "session.key"
# A key shorter than this is a password, not a key.
MIN_KEY_BYTES = 32
_MAX_KEY_BYTES = 4096
_SEALED = re.compile(rb'\{"mac":"hmac-sha256:([0-9a-f]{64})","record":')
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def default_key_file() -> Path:
    return config_home() / "heddle" / KEY_FILE


def session_key(spec: str, key_file: Path | None, environ: Mapping[str, str]) -> bytes:
    """The key the store `spec` names is sealed with: `--session-key FILE`, else `$HEDDLE_SESSION_KEY`,
    else (sqlite and file stores only) the key file in heddle's config folder, made on first use.
    UsageError (one line) for a key that is missing, too short or not private."""
    if key_file is not None:
        return _checked(_read_key_file(key_file, made=False), f"--session-key {key_file}")
    given = environ.get(ENV_SESSION_KEY)
    if given is not None:
        return _checked(given.strip().encode(), ENV_SESSION_KEY)
    if spec in ("sqlite", "file"):
        return _own_key()
    shown = spec.split("://", 1)[0] + "://..." if "://" in spec else spec
    raise UsageError(f"--session-store {shown} needs the key its records are authenticated with, the same for every "
                     f"server that shares the store: give --session-key FILE or set {ENV_SESSION_KEY} (at least "
                     f"{MIN_KEY_BYTES} bytes, such as the output of `openssl rand -hex 32`)")


def _checked(key: bytes, where: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise UsageError(f"{where}: the session key is {len(key)} bytes, fewer than {MIN_KEY_BYTES}; give a random "
                         "key (such as the output of `openssl rand -hex 32`)")
    return key


def _own_key() -> bytes:
    """The key file in heddle's config folder, made (0600, in a 0700 folder) when there is none."""
    path = default_key_file()
    make_private_dir(path.parent, what="heddle's config folder", setting="XDG_CONFIG_HOME")
    if not os.path.lexists(path):
        temp = path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it first: theirs is the key
                os.link(temp, path)
        finally:
            os.unlink(temp)
    return _checked(_read_key_file(path, made=True), str(path))


def _read_key_file(path: Path, *, made: bool) -> bytes:
    """The key in `path`: a regular file of this user's (or root's) that nobody else can read or write."""
    fix = "it is heddle's own, made on first use" if made else "give --session-key a file of your own"
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"session key {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"session key {path} cannot be read: {exc.strerror or exc} (a link is never followed; "
                         f"{fix})") from None
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"session key {path} is not a regular file; {fix}")
        if st.st_uid not in (uid, 0):
            raise UsageError(f"session key {path} is owned by uid {st.st_uid}, not by you (uid {uid}), so its owner "
                             f"could forge sessions; run `chown {uid} {path}` or {fix}")
        if st.st_mode & 0o077:
            raise UsageError(f"session key {path} can be read or written by others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}), who could forge sessions; run `chmod 600 {path}`")
        data = os.read(fd, _MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_BYTES:
        raise UsageError(f"session key {path} is over {_MAX_KEY_BYTES} bytes; give a file that holds the key alone")
    return data.strip()


def _mac(key: bytes, session_id: str, version: int, record: bytes) -> str:
    message = b"heddle-session\0" + session_id.encode() + b"\0" + str(version).encode() + b"\0" + record
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal(key: bytes, session_id: str, version: int, record: bytes) -> bytes:
    """`record` as the store keeps it at `version`."""
    mac = _mac(key, session_id, version, record)
    return b'{"mac":"hmac-sha256:' + mac.encode() + b'","record":' + record + b"}"


def _step_mac(key: bytes, session_id: str, base: int, seq: int, line: bytes) -> str:
    message = (b"heddle-step\0" + session_id.encode() + b"\0" + str(base).encode() + b"\0" + str(seq).encode()
               + b"\0" + line)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


_SEALED_STEP = re.compile(rb'\{"mac":"hmac-sha256:([0-9a-f]{64})","step":')


class SealedStore:
    """A store whose records are sealed on the way in and checked on the way out: every record read
    from it was written, at that version of that session, by a holder of the key. The rest of heddle
    sees the records alone."""

    def __init__(self, store: SessionStore, key: bytes) -> None:
        self.store = store
        self.name = store.name
        self._key = key

    def subkey(self, purpose: bytes) -> bytes:
        """A key for `purpose` derived from the session key: what every holder of the key (each replica
        sharing the store) can check, and nobody else can make, without the key itself leaving here."""
        return hmac.new(self._key, b"heddle subkey\0" + purpose, hashlib.sha256).digest()

    def _open(self, stored: Stored) -> Stored:
        sid, data = stored.id, stored.data
        head = _SEALED.match(data)
        if head is None or not data.endswith(b"}") or head.end() >= len(data):
            problem = "is not a sealed session record (damaged, or written by an earlier heddle)"
        else:
            record = data[head.end() : -1]
            if hmac.compare_digest(head.group(1).decode(), _mac(self._key, sid, stored.version, record)):
                return Stored(sid, stored.version, record, stored.updated)
            problem = ("fails its authentication: it was changed outside heddle, put back from an older copy, or "
                       "written under another session key")
        raise SessionUnreadable(f"session {sid!r} in {self.name}: its record {problem}; nothing of it is used: "
                                f"remove it with `heddle sessions rm {sid}`")

    async def open(self) -> None:
        await self.store.open()

    async def get(self, session_id: str) -> Stored | None:
        stored = await self.store.get(session_id)
        return None if stored is None else self._open(stored)

    async def create(self, session_id: str, data: bytes) -> Stored:
        check_size(session_id, data, MAX_SESSION_BYTES, store=self.name)
        saved = await self.store.create(session_id, seal(self._key, session_id, 1, data))
        return Stored(session_id, saved.version, data, saved.updated)

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_size(session_id, data, MAX_SESSION_BYTES, store=self.name)
        saved = await self.store.replace(session_id, seal(self._key, session_id, version + 1, data), version=version)
        return Stored(session_id, saved.version, data, saved.updated)

    async def claim(self, session_id: str, data: bytes, *, version: int) -> Stored:
        """`replace`, for taking over a run whose owner is gone: through the store's own `claim` where it
        has one (Postgres: a row another taker holds is skipped, not waited for)."""
        check_size(session_id, data, MAX_SESSION_BYTES, store=self.name)
        sealed = seal(self._key, session_id, version + 1, data)
        claim = getattr(self.store, "claim", None)
        saved: Stored = await (claim(session_id, sealed, version=version) if claim is not None
                               else self.store.replace(session_id, sealed, version=version))
        return Stored(session_id, saved.version, data, saved.updated)

    async def delete(self, session_id: str) -> bool:
        return await self.store.delete(session_id)

    async def list(self) -> list[Stored]:
        """Every session, most recently written first; SessionUnreadable for the first that fails its check."""
        return [self._open(stored) for stored in await self.store.list()]

    async def index(self) -> Index:
        return await self.store.index()

    async def index_page(self, *, since: float | None, until: float, after: tuple[float, str] | None,
                         limit: int) -> Index:
        return await index_page(self.store, since=since, until=until, after=after, limit=limit)

    async def survey(self) -> builtins.list[tuple[Stored, SessionUnreadable | None]]:
        """`list` for a listing that shows a session failing its check too (so that a person can remove
        it): each opened with None, or as stored with its refusal (its record is not to be used)."""
        out: builtins.list[tuple[Stored, SessionUnreadable | None]] = []
        for stored in await self.store.list():
            try:
                out.append((self._open(stored), None))
            except SessionUnreadable as exc:
                out.append((stored, exc))
        return out

    async def close(self) -> None:
        await self.store.close()

    # ------------------------------------------------------------------ steps (heddle.sessions.steps)

    @property
    def keeps_steps(self) -> bool:
        return isinstance(self.store, StepLog)

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        assert isinstance(self.store, StepLog), "steps are appended only to a store that keeps them"
        check_size(session_id, data, MAX_STEP_BYTES, store=self.name)
        mac = _step_mac(self._key, session_id, base, seq, data).encode()
        await self.store.append_step(session_id, base, seq, b'{"mac":"hmac-sha256:' + mac + b'","step":' + data + b"}")

    async def steps(self, session_id: str, base: int) -> builtins.list[tuple[int, bytes]]:
        """The steps after record version `base`, each checked as a record is: SessionUnreadable for the
        first that fails."""
        if not isinstance(self.store, StepLog):
            return []
        out: builtins.list[tuple[int, bytes]] = []
        for seq, data in await self.store.steps(session_id, base):
            head = _SEALED_STEP.match(data)
            line = data[head.end() : -1] if head is not None and data.endswith(b"}") else b""
            if head is None or not line or not hmac.compare_digest(
                    head.group(1).decode(), _step_mac(self._key, session_id, base, seq, line)):
                raise SessionUnreadable(
                    f"session {session_id!r} in {self.name}: its step {seq} fails its authentication (changed "
                    "outside heddle, or written under another session key); nothing of it is used: remove it with "
                    f"`heddle sessions rm {session_id}`")
            out.append((seq, line))
        return out

    async def drop_steps(self, session_id: str, below: int) -> None:
        if isinstance(self.store, StepLog):
            await self.store.drop_steps(session_id, below)
