"""A2A 1.0: the served bundle as an agent other agents call, over JSON-RPC and HTTP+JSON, streamed over SSE.

A turn is a task; the conversation is the A2A context, and the context is a session of the
server's store (its id is the session's, so any replica on the store continues it). A task's id is
`CONTEXT.N`, the Nth turn of that session. A run that stops to wait for a person ends its task in
`INPUT_REQUIRED`, saying what it waits for; the next message in the context (or to that task)
answers it: a text part answers a question, a data part `{"approve": true}`, `{"deny": REASON}` or
`{"tool_result": ...}` answers a call. Without `--session-store` each message is a task of its own.

The message's text parts are the user's message (for an agent); one data part holding an object
is the flow's inputs. What A2A defines that heddle does not do is refused by name (files, push
notifications, returnImmediately, task subscription and cancellation, tenants, extensions); an
error is answered in the binding's own shape (a JSON-RPC error object, or google.rpc's status with
an HTTP code), never a 500 for a caller's mistake. Each run is admitted, limited, drained and
counted as one of POST /v1/runs (Service.submit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from heddle.errors import HeddleError, SessionNotFound
from heddle.server.body import Gone, read_json_object
from heddle.server.errors import ApiError, status_of
from heddle.server.surfaces.card import A2A_PATH, CARD_PATH, agent_card, card_json, load_card_key
from heddle.server.surfaces.stream import first_item, relay, task_of, watched

if TYPE_CHECKING:
    from a2a.types import Message, StreamResponse, Task

    from heddle.engine.events import Event
    from heddle.engine.run import RunOutcome
    from heddle.format.keys import SigningKey
    from heddle.server.service import Service, Submitted

log = logging.getLogger("heddle.server")

VERSION_HEADER = "a2a-version"
CANCELLED = "the server is shutting down and stopped this run; send the message again, to another instance"
VERSIONS = ("1.0", "1")
REST_TYPE = "application/a2a+json"  # the HTTP+JSON binding's answers (its errors are google.rpc's application/json)
_DONE = object()  # on a run's queue: its task has ended


# ------------------------------------------------------------------------------------------ errors


@dataclass(eq=False)
class Refusal(Exception):
    """An A2A error: its JSON-RPC code, HTTP status and google.rpc status, and A2A's reason."""

    code: int
    http: int
    status: str
    reason: str
    message: str
    retry_after: str | None = None

    def jsonrpc(self, request_id: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "error": {
            "code": self.code, "message": self.message, "data": [self._info()]}}

    def rest(self) -> dict[str, Any]:
        return {"error": {"code": self.http, "status": self.status, "message": self.message,
                          "details": [self._info()]}}

    def _info(self) -> dict[str, Any]:
        # heddle's own reasons (BUSY, DRAINING, ...) carry its implementation-defined codes, -32099..-32050.
        domain = "heddle" if -32099 <= self.code <= -32050 else "a2a-protocol.org"
        return {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": self.reason, "domain": domain,
                "metadata": {}}


def invalid_params(message: str) -> Refusal:
    return Refusal(-32602, 400, "INVALID_ARGUMENT", "INVALID_PARAMS", message)


def invalid_request(message: str) -> Refusal:
    return Refusal(-32600, 400, "INVALID_ARGUMENT", "INVALID_REQUEST", message)


def task_not_found(message: str) -> Refusal:
    return Refusal(-32001, 404, "NOT_FOUND", "TASK_NOT_FOUND", message)


def unsupported(message: str) -> Refusal:
    return Refusal(-32004, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", message)


def _refusal_of(exc: BaseException) -> Refusal | None:
    """A refusal before the run started, in A2A's terms; None for a failure of the run itself."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, ApiError):
        retry = exc.headers.get("Retry-After")
        # Implementation-defined JSON-RPC codes (-32050..) for what A2A has no error of its own for.
        if exc.status == 429:
            return Refusal(-32050, 429, "RESOURCE_EXHAUSTED", "BUSY", exc.message, retry)
        if exc.status == 507:
            return Refusal(-32050, 429, "RESOURCE_EXHAUSTED", "TOO_MANY_SESSIONS", exc.message, retry)
        if exc.status == 503:
            return Refusal(-32051, 503, "UNAVAILABLE", "DRAINING", exc.message, retry)
        if exc.status == 413:
            return invalid_request(exc.message)
        if exc.status < 500:
            return invalid_params(exc.message)
        return None
    if isinstance(exc, SessionNotFound):
        return invalid_params(exc.message)
    if isinstance(exc, HeddleError) and status_of(exc) < 500 and exc.kind != "call_denied":
        return invalid_params(exc.message)
    return None


# ------------------------------------------------------------------------------------------ messages


def _read_message(message: Message, raw: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The user's text (its text parts joined) and the one data part's object, as sent."""
    from a2a.types import Role

    if message.role != Role.ROLE_USER:
        raise invalid_params("message.role: a message to this agent is the user's (ROLE_USER)")
    if not message.message_id:
        raise invalid_params("message.messageId is required")
    if message.extensions:
        raise invalid_params(f"message.extensions: this agent uses no extension ({message.extensions[0]!r})")
    if message.reference_task_ids:
        raise invalid_params("message.referenceTaskIds: this agent reads no other task; send what it needs in "
                             "the message")
    texts: list[str] = []
    data: dict[str, Any] | None = None
    sent = raw.get("parts")
    raw_parts: list[Any] = sent if isinstance(sent, list) else []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            # The value as sent: the protocol's Value would turn every number into a double.
            value = raw_parts[index].get("data") if index < len(raw_parts) and isinstance(raw_parts[index], dict) \
                else None
            if not isinstance(value, dict):
                raise invalid_params(f"message.parts[{index}].data: give the inputs (or an answer) as one JSON object")
            if data is not None:
                raise invalid_params(f"message.parts[{index}]: give at most one data part")
            data = value
        else:
            raise Refusal(-32005, 400, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED",
                          f"message.parts[{index}]: {kind or 'an empty'} part; this agent reads text parts and "
                          "one data part, not files")
    return ("\n".join(texts) if texts else None), data


def _json_value(value: Any) -> Any:
    from google.protobuf.json_format import Parse
    from google.protobuf.struct_pb2 import Value

    out = Value()
    # Through JSON text: anything JSON can carry (a tool's output) becomes a Value.
    Parse(json.dumps(value, default=str), out)
    return out


def _agent_message(context_id: str, task_id: str, texts: list[str], data: Any = None) -> Message:
    from a2a.types import Message, Part, Role

    parts = [Part(text=text) for text in texts]
    if data is not None:
        parts.append(Part(data=_json_value(data)))
    return Message(message_id=uuid.uuid4().hex, context_id=context_id, task_id=task_id, role=Role.ROLE_AGENT,
                   parts=parts)


def _answer_texts(outcome: RunOutcome) -> list[str]:
    """What the run says to its person: its messages, then its one text output."""
    texts = [str(m) for m in outcome.messages]
    strings = [v for v in outcome.outputs.values() if isinstance(v, str)]
    if len(outcome.outputs) == 1 and strings:
        texts.append(strings[0])
    return texts


def _wait_message(context_id: str, task_id: str, waiting: dict[str, Any], messages: list[str]) -> Message:
    """What an INPUT_REQUIRED task shows: the prompt (or the call to approve) and the wait as data."""
    kind = waiting.get("kind")
    if kind == "message":
        asked = str(waiting.get("prompt") or "")
    elif kind == "approval":
        asked = (f"approve the call of tool {waiting.get('tool')!r}: answer with a data part {{\"approve\": true}} "
                 "or {\"deny\": REASON}")
    else:
        asked = f"answer the call of tool {waiting.get('tool')!r} with a data part {{\"tool_result\": ...}}"
    return _agent_message(context_id, task_id, [*messages, asked] if asked else messages, {"waiting_for": waiting})


# ------------------------------------------------------------------------------------------ the agent


@dataclass
class Turn:
    """A message resolved against the store: the run's body and the task it is."""

    body: dict[str, Any]
    context_id: str
    task_id: str
    created: bool = False  # the context (session) was made for this message


class A2AAgent:
    """The bundle served as an A2A agent, over the server's one run core."""

    def __init__(self, service: Service, key: SigningKey | None) -> None:
        self.service = service
        self.key = key

    # ---- resolving a message

    async def _turn(self, message: Message, raw: dict[str, Any]) -> Turn:
        service = self.service
        text, data = _read_message(message, raw)
        if service.sessions is None:
            if message.context_id or message.task_id:
                raise invalid_params("message.contextId/taskId: this server keeps no conversations (it was started "
                                     "without --session-store); send each message on its own")
            return Turn(self._new_body(text, data), uuid.uuid4().hex, uuid.uuid4().hex)
        context_id = message.context_id
        if message.task_id:
            context_id, _ = self._task(message.task_id, context_id)
        if not context_id:
            body = self._new_body(text, data)  # checked before a conversation is made for it
            context_id = await service.new_session()
            return Turn({**body, "session": context_id}, context_id, f"{context_id}.1", created=True)
        summary = await self._summary(context_id, f"message.contextId {context_id!r}")
        number = int(summary["turns"]) + 1
        task_id = f"{context_id}.{number}"
        if message.task_id and message.task_id != task_id:
            raise unsupported(f"task {message.task_id!r} has ended; send a new message in its context "
                              f"({context_id}) without taskId")
        if summary.get("status") == "waiting":
            answer = self._answer(summary.get("waiting_for") or {}, text, data, task_id)
            return Turn({"session": context_id, "answer": answer}, context_id, task_id)
        if message.task_id:
            raise unsupported(f"task {message.task_id!r} waits for nothing; send a new message in its context "
                              f"({context_id}) without taskId")
        return Turn({**self._new_body(text, data), "session": context_id}, context_id, task_id)

    def _new_body(self, text: str | None, data: dict[str, Any] | None) -> dict[str, Any]:
        from heddle.agentspec.roots import document_root

        sealed = self.service.sealed
        assert sealed is not None, "a2a is served only with a bundle"
        flow = sealed.flow
        if document_root(flow).conversational:
            if text is None:
                raise invalid_params(f"the agent {flow.name!r} answers a user: send the user's message as a text "
                                     "part")
        elif text is not None:
            raise invalid_params(f"a text part: {flow.name!r} is a flow, not an agent; send its inputs as one data "
                                 "part holding an object")
        body: dict[str, Any] = {"inputs": data} if data is not None else {}
        if text is not None:
            body["message"] = text
        return body

    @staticmethod
    def _answer(waiting: dict[str, Any], text: str | None, data: dict[str, Any] | None, task_id: str
                ) -> dict[str, Any]:
        if data is not None:
            if text is not None:
                raise invalid_params(f"task {task_id} waits for one answer; send a text part or a data part, not both")
            return data
        if waiting.get("kind") == "message" and text is not None:
            return {"message": text}
        what = ('a data part {"approve": true} or {"deny": REASON}' if waiting.get("kind") == "approval"
                else 'a data part {"tool_result": ...}' if waiting.get("kind") == "client_tool" else "a text part")
        raise invalid_params(f"task {task_id} waits for {waiting.get('kind')} at node {waiting.get('node')!r}; "
                             f"answer with {what}")

    @staticmethod
    def _task(task_id: str, context_id: str) -> tuple[str, int]:
        session, dot, number = task_id.rpartition(".")
        if not dot or not number.isdigit() or not session:
            raise task_not_found(f"there is no task {task_id!r}")
        if context_id and context_id != session:
            raise invalid_params(f"task {task_id!r} is not of context {context_id!r}")
        return session, int(number)

    async def _summary(self, session: str, named: str, *, task: bool = False) -> dict[str, Any]:
        from heddle.errors import SessionError

        try:
            return await self.service.session_summary(session)
        except SessionNotFound:
            message = f"{named}: there is no such conversation (it was never started here, or it expired)"
            raise (task_not_found(message) if task else invalid_params(message)) from None
        except SessionError as exc:
            if exc.http_status == 400:  # a malformed id
                raise (task_not_found if task else invalid_params)(f"{named}: {exc.message}") from None
            raise

    # ---- running it

    async def _start(self, message: Message, raw: dict[str, Any], on_event: Callable[[Event], None]
                     ) -> tuple[Turn, Submitted]:
        turn = await self._turn(message, raw)
        try:
            return turn, await self.service.submit(turn.body, on_event)
        except BaseException:
            if turn.created:
                # The conversation made for a message that did not run is removed with it.
                try:
                    await self.service.delete_session(turn.context_id)
                except (HeddleError, ApiError):
                    log.warning("could not remove the unused A2A context %s", turn.context_id)
            raise

    def _task_of(self, turn: Turn, user: Message, *, state: Any, status: Message | None = None,
                 artifacts: list[Any] | None = None) -> Task:
        from a2a.types import Task, TaskStatus

        history = [user] + ([status] if status is not None else [])
        return Task(id=turn.task_id, context_id=turn.context_id, status=TaskStatus(state=state, message=status),
                    artifacts=artifacts or [], history=history)

    def _ended(self, turn: Turn, user: Message, submitted: Submitted, outcome: RunOutcome | None,
               failure: BaseException | None) -> Task:
        """The task as its run ended: completed with its outputs, waiting for input, or failed."""
        from a2a.types import Artifact, Part, TaskState

        if failure is not None or outcome is None:
            reason = (CANCELLED if failure is None or isinstance(failure, asyncio.CancelledError)
                      else getattr(failure, "message", None) or f"the run failed ({type(failure).__name__})")
            return self._task_of(turn, user, state=TaskState.TASK_STATE_FAILED,
                                 status=_agent_message(turn.context_id, turn.task_id, [reason]))
        if outcome.waiting is not None:
            return self._task_of(turn, user, state=TaskState.TASK_STATE_INPUT_REQUIRED, status=_wait_message(
                turn.context_id, turn.task_id, outcome.waiting.as_json(), [str(m) for m in outcome.messages]))
        reply = _agent_message(turn.context_id, turn.task_id, _answer_texts(outcome))
        artifact = Artifact(artifact_id="outputs", name="outputs", parts=[Part(data=_json_value(outcome.outputs))])
        return self._task_of(turn, user, state=TaskState.TASK_STATE_COMPLETED, status=reply, artifacts=[artifact])

    async def send(self, message: Message, raw: dict[str, Any]) -> Task:
        """SendMessage: the task once its run has ended."""
        turn, submitted = await self._start(message, raw, lambda event: None)
        try:
            run = task_of(submitted)
            # Waited for, not awaited: a run the server cancelled (its drain) is told from this request's own end.
            await asyncio.wait({run})
            if run.cancelled():
                raise Refusal(-32051, 503, "UNAVAILABLE", "CANCELLED", CANCELLED)
            failure = run.exception()
            if failure is not None:
                refusal = _refusal_of(failure)
                if refusal is not None:
                    raise refusal
                self._log_failure(failure)
                return self._ended(turn, message, submitted, None, failure)
            return self._ended(turn, message, submitted, await submitted.outcome(), None)
        finally:
            await submitted.aclose()

    @staticmethod
    def _log_failure(exc: BaseException) -> None:
        if not isinstance(exc, HeddleError):
            log.error("an A2A task's run failed unexpectedly", exc_info=exc)

    async def stream(self, message: Message, raw: dict[str, Any]) -> AsyncIterator[StreamResponse]:
        """SendStreamingMessage: the task, its progress as status and artifact updates, then its end. The
        first item is sent only once the run has started, so that a refusal is an error of its own."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        turn, submitted = await self._start(message, raw, queue.put_nowait)
        task_of(submitted).add_done_callback(lambda _: queue.put_nowait(_DONE))
        return self._updates(turn, message, submitted, queue)

    async def _updates(self, turn: Turn, user: Message, submitted: Submitted, queue: asyncio.Queue[Any]
                       ) -> AsyncIterator[StreamResponse]:
        from a2a.types import (
            Artifact,
            Part,
            StreamResponse,
            TaskArtifactUpdateEvent,
            TaskState,
            TaskStatus,
            TaskStatusUpdateEvent,
        )

        from heddle.engine import events as ev

        try:
            first = await queue.get()
            if first is _DONE and not submitted.held:
                # Ended before any event: a refusal found once the turn was known is an error of its own.
                failure = None if task_of(submitted).cancelled() else task_of(submitted).exception()
                refusal = _refusal_of(failure) if failure is not None else None
                if refusal is not None:
                    raise refusal
            yield StreamResponse(task=self._task_of(turn, user, state=TaskState.TASK_STATE_WORKING))
            streamed_text = False
            item = first
            while True:
                if item is _DONE:
                    break
                if isinstance(item, ev.TokenDelta):
                    yield StreamResponse(artifact_update=TaskArtifactUpdateEvent(
                        task_id=turn.task_id, context_id=turn.context_id, append=streamed_text,
                        artifact=Artifact(artifact_id="answer", name="answer", parts=[Part(text=item.text)])))
                    streamed_text = True
                else:
                    update = self._progress(turn, item)
                    if update is not None:
                        yield StreamResponse(status_update=TaskStatusUpdateEvent(
                            task_id=turn.task_id, context_id=turn.context_id,
                            status=TaskStatus(state=TaskState.TASK_STATE_WORKING, message=update)))
                item = await queue.get()
            failure = None if task_of(submitted).cancelled() else task_of(submitted).exception()
            outcome = None
            if failure is None and not task_of(submitted).cancelled():
                outcome = await submitted.outcome()  # the session's held last event is written by now
            elif failure is not None:
                self._log_failure(failure)
            task = self._ended(turn, user, submitted, outcome, failure)
            for artifact in task.artifacts:
                yield StreamResponse(artifact_update=TaskArtifactUpdateEvent(
                    task_id=turn.task_id, context_id=turn.context_id, artifact=artifact, last_chunk=True))
            yield StreamResponse(status_update=TaskStatusUpdateEvent(
                task_id=turn.task_id, context_id=turn.context_id, status=task.status))
        finally:
            await submitted.aclose()

    @staticmethod
    def _progress(turn: Turn, event: Any) -> Message | None:
        """What a status update says of one of heddle's events while the task works (None: nothing)."""
        from heddle.engine import events as ev

        if isinstance(event, ev.Message):
            return _agent_message(turn.context_id, turn.task_id, [event.text])
        if isinstance(event, (ev.ToolCall, ev.ToolResult, ev.NodeStart, ev.NodeComplete)):
            return _agent_message(turn.context_id, turn.task_id, [], {"event": event.to_dict()})
        return None

    async def get_task(self, task_id: str) -> Task:
        """GetTask: a task of a conversation, as its session says: waiting, or completed."""
        from a2a.types import Task, TaskState, TaskStatus

        if self.service.sessions is None:
            raise task_not_found(f"there is no task {task_id!r}: this server keeps no tasks (it was started without "
                                 "--session-store)")
        context_id, number = self._task(task_id, "")
        summary = await self._summary(context_id, f"task {task_id!r}", task=True)
        turns = int(summary["turns"])
        if number <= turns:
            return Task(id=task_id, context_id=context_id, status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
        if number == turns + 1 and summary.get("status") == "waiting":
            status = _wait_message(context_id, task_id, summary.get("waiting_for") or {}, [])
            return Task(id=task_id, context_id=context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_INPUT_REQUIRED, message=status))
        raise task_not_found(f"there is no task {task_id!r} (a task that failed is reported once, to its sender)")

    async def cancel_task(self, task_id: str) -> Task:
        await self.get_task(task_id)
        raise Refusal(-32002, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE",
                      f"task {task_id!r} cannot be canceled: a task runs while its request is open (close it to "
                      "stop the run), and one waiting for input holds nothing")


# ------------------------------------------------------------------------------------------ bindings

_UNSUPPORTED = {
    "ListTasks": "ListTasks is not served: a task is found by its id (CONTEXT.N)",
    "SubscribeToTask": "SubscribeToTask is not served: a task's updates go to the stream that sent its message",
    "GetExtendedAgentCard": "this agent has no extended card",
}
_PUSH = ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
         "DeleteTaskPushNotificationConfig")


def _check_version(scope_headers: Any) -> None:
    version = scope_headers.get(VERSION_HEADER)
    if version is not None and version.strip() not in VERSIONS:
        raise Refusal(-32009, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED",
                      f"A2A-Version {version!r}: this agent speaks A2A 1.0")


def _parsed(params: Any, into: Any) -> Any:
    """A request message from its JSON: a field A2A does not define is refused, naming it; a tenant too."""
    from google.protobuf.json_format import ParseDict, ParseError

    if not isinstance(params, dict):
        raise invalid_params(f"params: give a {type(into).__name__} object")
    try:
        request = ParseDict(params, into)
    except ParseError as exc:
        raise invalid_params(f"params: {exc}") from None
    if getattr(request, "tenant", ""):
        raise invalid_params(f"tenant {request.tenant!r}: this server serves one agent, of no tenant")
    return request


def _send_request(params: Any) -> tuple[Any, dict[str, Any]]:
    """SendMessageRequest from its JSON, checked for what is not served."""
    from a2a.types import SendMessageRequest

    request = _parsed(params, SendMessageRequest())
    if not request.HasField("message"):
        raise invalid_params("params.message is required")
    config = request.configuration
    if config.HasField("task_push_notification_config"):
        raise Refusal(-32003, 400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED",
                      "configuration.taskPushNotificationConfig: this agent sends no push notifications; stream "
                      "the task instead")
    if config.return_immediately:
        raise unsupported("configuration.returnImmediately: a task runs while its request is open; stream it "
                          "(SendStreamingMessage) to see it work")
    modes = set(config.accepted_output_modes)
    if modes and not modes & {"text/plain", "application/json"}:
        raise Refusal(-32005, 400, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED",
                      "configuration.acceptedOutputModes: this agent answers text/plain and application/json")
    raw = params.get("message")
    return request, raw if isinstance(raw, dict) else {}


def _trimmed(task: Task, config: Any) -> Task:
    """The task with at most `configuration.historyLength` messages of its history, when it is given."""
    if config.HasField("history_length"):
        keep = max(config.history_length, 0)
        del task.history[:max(len(task.history) - keep, 0)]
    return task


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _result(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    result: dict[str, Any] = MessageToDict(message)
    return result


async def _json_rpc_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, within the body cap: -32700 for what is not JSON, -32600 for a batch."""
    from heddle.canonical import CanonicalJSONError
    from heddle.safeparse import ParseLimitError, loads_strict_json
    from heddle.server.body import read_body

    try:
        raw = await read_body(request, limit)
    except ApiError as exc:
        raise invalid_request(exc.message) from None
    try:
        body = loads_strict_json(raw)
    except (ValueError, UnicodeDecodeError, ParseLimitError, CanonicalJSONError) as exc:
        raise Refusal(-32700, 400, "INVALID_ARGUMENT", "PARSE_ERROR", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_request("the body is one JSON-RPC request object (batches are not served)")
    return body


class JsonRpc:
    """POST /a2a: A2A's JSON-RPC binding."""

    def __init__(self, agent: A2AAgent) -> None:
        self.agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        request_id: Any = None
        try:
            body = await _json_rpc_body(request, self.agent.service.config.max_body_bytes)
            request_id = body.get("id")
            if isinstance(request_id, bool) or not isinstance(request_id, (str, int, type(None))):
                request_id = None
                raise invalid_request("id: give a string, a number or null")
            method = body.get("method")
            if body.get("jsonrpc") != "2.0" or not isinstance(method, str):
                raise invalid_request("a JSON-RPC 2.0 request has \"jsonrpc\": \"2.0\" and a \"method\"")
            _check_version(request.headers)
            params = body.get("params", {})
            if method == "SendStreamingMessage":
                message, raw = _send_request(params)
                updates = await watched(self.agent.stream(message.message, raw), receive)
                first = await watched(first_item(updates), receive)
                await relay(updates, first, lambda item: b"data: " + _dumps(
                    {"jsonrpc": "2.0", "id": request_id, "result": _result(item)}) + b"\n\n", receive, send)
                return
            result = await watched(self._call(method, params), receive)
            await JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": result})(scope, receive, send)
        except Refusal as exc:
            await JSONResponse(exc.jsonrpc(request_id))(scope, receive, send)
        except Gone:
            return
        except (ApiError, HeddleError) as exc:
            refused = _refusal_of(exc) or Refusal(-32603, 500, "INTERNAL", "INTERNAL_ERROR", str(exc))
            await JSONResponse(refused.jsonrpc(request_id))(scope, receive, send)

    async def _call(self, method: str, params: Any) -> dict[str, Any]:
        agent = self.agent
        if method == "SendMessage":
            message, raw = _send_request(params)
            return {"task": _result(_trimmed(await agent.send(message.message, raw), message.configuration))}
        if method in ("GetTask", "CancelTask"):
            from a2a.types import CancelTaskRequest, GetTaskRequest

            request = _parsed(params, GetTaskRequest() if method == "GetTask" else CancelTaskRequest())
            if not request.id:
                raise invalid_params("params.id: give the task's id")
            task = await (agent.get_task(request.id) if method == "GetTask" else agent.cancel_task(request.id))
            return _result(task)
        if method in _PUSH:
            raise Refusal(-32003, 400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED",
                          f"{method}: this agent sends no push notifications")
        if method in _UNSUPPORTED:
            code = -32007 if method == "GetExtendedAgentCard" else -32004
            raise Refusal(code, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", _UNSUPPORTED[method])
        raise Refusal(-32601, 404, "NOT_FOUND", "METHOD_NOT_FOUND", f"method {method!r} is not an A2A 1.0 method")


class Rest:
    """A2A's HTTP+JSON binding, under /a2a."""

    def __init__(self, agent: A2AAgent) -> None:
        self.agent = agent

    async def _refused(self, refusal: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {"Retry-After": refusal.retry_after} if refusal.retry_after else None
        await JSONResponse(refusal.rest(), status_code=refusal.http, headers=headers)(scope, receive, send)

    def endpoint(self, kind: str) -> _Endpoint:
        return _Endpoint(self, kind)

    async def serve(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            _check_version(request.headers)
            await self._handle(kind, request, scope, receive, send)
        except Refusal as refusal:
            await self._refused(refusal, scope, receive, send)
        except Gone:
            return
        except (ApiError, HeddleError) as exc:
            await self._refused(_refusal_of(exc) or Refusal(-32603, 500, "INTERNAL", "INTERNAL_ERROR", str(exc)),
                                scope, receive, send)

    async def _handle(self, kind: str, request: Request, scope: Scope, receive: Receive, send: Send) -> None:
        agent = self.agent
        if kind in ("send", "stream"):
            try:
                body = await read_json_object(request, agent.service.config.max_body_bytes)
            except ApiError as exc:
                raise invalid_request(exc.message) from None
            message, raw = _send_request(body)
            if kind == "stream":
                updates = await watched(agent.stream(message.message, raw), receive)
                first = await watched(first_item(updates), receive)
                await relay(updates, first, lambda item: b"data: " + _dumps(_result(item)) + b"\n\n", receive, send)
                return
            task = await watched(agent.send(message.message, raw), receive)
            await JSONResponse({"task": _result(_trimmed(task, message.configuration))}, media_type=REST_TYPE)(
                scope, receive, send)
            return
        task_id = request.path_params.get("id", "")
        if kind == "get":
            await JSONResponse(_result(await agent.get_task(task_id)), media_type=REST_TYPE)(scope, receive, send)
        elif kind == "cancel":
            await agent.cancel_task(task_id)
        elif kind == "push":
            raise Refusal(-32003, 400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED",
                          "this agent sends no push notifications")
        else:
            raise unsupported(_UNSUPPORTED[kind])


class _Endpoint:
    """One route of the HTTP+JSON binding, as a plain ASGI app (so that it can watch its connection)."""

    def __init__(self, rest: Rest, kind: str) -> None:
        self.rest = rest
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.rest.serve(self.kind, scope, receive, send)


def routes(service: Service) -> list[BaseRoute]:
    """The agent card, the JSON-RPC binding at /a2a and the HTTP+JSON binding under it."""
    config = service.config
    key = load_card_key(config.card_key) if config.card_key is not None else None
    agent = A2AAgent(service, key)
    rest = Rest(agent)

    async def card(request: Request) -> Response:
        base = config.public_url or str(request.base_url)
        return JSONResponse(card_json(agent_card(service, base, key)), headers={"Cache-Control": "no-cache"})

    push = f"{A2A_PATH}/tasks/{{id}}/pushNotificationConfigs"
    return [
        Route(CARD_PATH, card, methods=["GET"]),
        Route(A2A_PATH, JsonRpc(agent), methods=["POST"]),
        Route(f"{A2A_PATH}/message:send", rest.endpoint("send"), methods=["POST"]),
        Route(f"{A2A_PATH}/message:stream", rest.endpoint("stream"), methods=["POST"]),
        Route(f"{A2A_PATH}/tasks/{{id}}:cancel", rest.endpoint("cancel"), methods=["POST"]),
        Route(f"{A2A_PATH}/tasks/{{id}}:subscribe", rest.endpoint("SubscribeToTask"), methods=["GET", "POST"]),
        Route(push, rest.endpoint("push"), methods=["GET", "POST"]),
        Route(f"{push}/{{push_id}}", rest.endpoint("push"), methods=["GET", "DELETE"]),
        Route(f"{A2A_PATH}/tasks/{{id}}", rest.endpoint("get"), methods=["GET"]),
        Route(f"{A2A_PATH}/tasks", rest.endpoint("ListTasks"), methods=["GET"]),
        Route(f"{A2A_PATH}/extendedAgentCard", rest.endpoint("GetExtendedAgentCard"), methods=["GET"]),
    ]
