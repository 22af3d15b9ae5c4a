"""The served bundle as the protocol surfaces (MCP, the OpenAI Responses API) see it: one agent, its
description and input schema, and one turn of it run exactly as `POST /v1/runs` runs one.

Every turn goes through the same admission, preparation and runner as `/v1/runs` (so the same limits,
drain, metrics and session store), here for a caller that is not an HTTP request of heddle's own shape.

A conversation, or a run that waits for a person, lives in a session of the server's store. A surface
hands its caller a *handle* for it: the session id, the store version the turn left it at, and a MAC
under a key derived from the session key. Any replica sharing the store (and so the key) can check it,
so no replica needs sticky sessions; a handle of an earlier turn is refused, since a conversation
continues only from its latest turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.errors import SessionError, SessionNotFound
from heddle.server.errors import ApiError

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.engine.events import Event
    from heddle.engine.journal import WaitingFor
    from heddle.engine.run import RunOutcome
    from heddle.server.service import Service

HANDLE_PREFIX = "h1"
_HANDLE_PURPOSE = b"surface session handle"
_MAC_HEX = 32  # 128 bits: a handle cannot be guessed, nor one session's turned into another's


class UnknownSession(ApiError):
    """A handle this server did not mint, or one of a session that no longer is (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(404, "unknown_session", message)


@dataclass(frozen=True)
class Reply:
    """One turn's end: its outcome and, in a session, the handle that continues it."""

    outcome: RunOutcome
    handle: str | None


def property_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """A StartNode property as a JSON Schema property (its title is the property's name)."""
    return {k: v for k, v in prop.items() if k != "title"}


class ServedAgent:
    """What the surfaces serve: the bundle of the edition served now (a following server swaps it)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    # ------------------------------------------------------------------ description

    @property
    def sealed(self) -> Any:
        sealed = self.service.sealed
        assert sealed is not None, "the surfaces serve a bundle (config.surfaces requires --bundle)"
        return sealed

    @property
    def flow(self) -> Flow:
        flow: Flow = self.sealed.flow
        return flow

    @property
    def name(self) -> str:
        return str(self.sealed.name)

    @property
    def description(self) -> str:
        from heddle.agentspec.roots import document_root

        root = document_root(self.flow)
        described = self.flow.description
        if not described:
            kind = "agent" if root.conversational else "flow"
            described = f"The {kind} {self.name!r}, sealed in a heddle bundle."
        return str(described)

    @property
    def conversational(self) -> bool:
        from heddle.agentspec.roots import document_root

        return document_root(self.flow).conversational

    def proof(self) -> dict[str, Any]:
        """What proves what answers: the bundle digest, its signers' key ids, each tool's schema fingerprint."""
        sealed = self.sealed
        return {"name": self.name, "digest": sealed.digest, "signers": list(sealed.signers),
                "toolFingerprints": dict(sealed.tool_fingerprints)}

    def inputs(self) -> list[dict[str, Any]]:
        """The StartNode's declared inputs a caller gives (the ones the bundle recorded are defaults)."""
        start = self.flow.start_node
        return list(start.inputs or start.outputs or [])

    def input_schema(self, *, extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The StartNode's inputs as one JSON Schema object, with `message` for an agent and `extra`."""
        recorded = self.sealed.input
        properties: dict[str, Any] = {}
        required: list[str] = []
        for prop in self.inputs():
            name = prop["title"]
            properties[name] = property_schema(prop)
            if "default" not in prop and name not in recorded:
                required.append(name)
        if self.conversational:
            properties["message"] = {"type": "string", "description": "The user's message to the agent."}
            required.append("message")
        properties.update(extra or {})
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}

    # ------------------------------------------------------------------ handles

    @property
    def keeps_sessions(self) -> bool:
        return self.service.sessions is not None

    def _key(self) -> bytes:
        store: Any = self.service.sessions
        while store is not None and not hasattr(store, "subkey"):
            store = getattr(store, "store", None)  # the wrappers (Expiring) keep the sealed store inside
        assert store is not None, "a server's session store is always sealed (heddle.sessions.open)"
        key: bytes = store.subkey(_HANDLE_PURPOSE)
        return key

    def _mac(self, session: str, version: int) -> str:
        text = f"{HANDLE_PREFIX}\0{session}\0{version}".encode()
        return hmac.new(self._key(), text, hashlib.sha256).hexdigest()[:_MAC_HEX]

    def handle(self, session: str, version: int) -> str:
        return f"{HANDLE_PREFIX}.{session}.{version}.{self._mac(session, version)}"

    def open_handle(self, handle: str, *, what: str) -> tuple[str, int]:
        """The session and version a handle names, or UnknownSession (`what` names where it came from)."""
        parts = handle.split(".") if isinstance(handle, str) else []
        if len(parts) == 4 and parts[0] == HANDLE_PREFIX and parts[2].isdigit() and self.keeps_sessions:
            session, version = parts[1], int(parts[2])
            if hmac.compare_digest(parts[3], self._mac(session, version)):
                return session, version
        raise UnknownSession(f"{what} is not one this server issued (or it was made under another session "
                             "key); start a new conversation without it")

    async def _stored(self, session: str) -> tuple[int, WaitingFor | None]:
        """The session's version now and what its run waits for; UnknownSession when it is gone."""
        from heddle.server.sessions import for_http
        from heddle.sessions.record import decode

        store: Any = self.service.sessions
        assert store is not None
        try:
            got = await store.get(session)
            if got is None:
                raise SessionNotFound("")
            record = decode(session, got.data, store=store.name)
        except SessionNotFound:
            raise UnknownSession(f"the conversation {session!r} is gone (it expired or was removed); start a new "
                                 "one") from None
        except SessionError as exc:
            raise for_http(exc, store.name) from None
        pending = record.pending
        waiting = pending.waiting_for if pending is not None and pending.status == "waiting" else None
        return int(got.version), waiting

    async def latest(self, handle: str, *, what: str) -> tuple[str, WaitingFor | None]:
        """The session a handle names and what it waits for, if the handle is of its latest turn."""
        session, version = self.open_handle(handle, what=what)
        now, waiting = await self._stored(session)
        if now != version:
            raise ApiError(409, "not_latest", f"{what} is not the latest turn of its conversation (another turn "
                                              "came after it); continue from the latest, or start a new one")
        return session, waiting

    def needs_session(self) -> bool:
        """Whether a turn must run in a session: an agent's conversation, or a document that may wait."""
        from heddle.agentspec.roots import document_root

        return self.keeps_sessions and (self.conversational or bool(document_root(self.flow).waits))

    # ------------------------------------------------------------------ one turn

    async def run(self, *, inputs: dict[str, Any], message: str | None = None, session: str | None = None,
                  answer: dict[str, Any] | None = None, on_event: Callable[[Event], None] | None = None,
                  keep: bool = True) -> Reply:
        """One turn, as `POST /v1/runs` with these fields runs it: a new session when one is needed and
        none is given (unless `keep` is False: the caller asked that nothing be kept). Errors are the
        ApiError or HeddleError /v1/runs answers with (a surface maps them)."""
        service = self.service
        if session is None and answer is None and keep and self.needs_session():
            # Refused (and counted) as the run would be, before a session is made for nothing.
            admission = service.admission
            admission.check_open()
            if admission.active >= admission.limit:
                admission.admit()  # raises the 429
            session = await service.new_session()
        body: dict[str, Any] = {}
        if inputs:
            body["inputs"] = inputs
        if message is not None:
            body["message"] = message
        if session is not None:
            body["session"] = session
        if answer is not None:
            body["answer"] = answer
        outcome = await self._run(body, on_event)
        if session is None:
            return Reply(outcome, None)
        # The version this turn wrote, not the store's now: a turn landing meanwhile is not this one.
        assert outcome.session_version is not None, "a run in a session ends with the version its turn wrote"
        return Reply(outcome, self.handle(session, outcome.session_version))

    async def _run(self, body: dict[str, Any], on_event: Callable[[Event], None] | None) -> RunOutcome:
        from heddle.engine.events import ignore

        run = await self.service.submit(body, on_event or ignore)
        try:
            return await run.outcome()
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the caller went away (or its protocol's handler was stopped): so does the run
            # The server stopped it (--drain-timeout passed, or a second signal).
            raise ApiError(503, "cancelled", "the server is shutting down and stopped this run "
                                             "(--drain-timeout passed); retry on another instance") from None
        finally:
            await run.aclose()


