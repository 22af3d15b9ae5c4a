"""AG-UI: a run's events as the Agent-User Interaction protocol's, for `POST /v1/runs?protocol=ag-ui`.

The request is POST /v1/runs's own (inputs, message, session, answer); the answer is AG-UI's event
stream over SSE (`data: EVENT`), one run of it:

- the run: RUN_STARTED (threadId: the session, else the run's id), then RUN_FINISHED with the flow's
  outputs as its result; a run that fails ends with RUN_ERROR (its code heddle's error type);
- each node a step: STEP_STARTED and STEP_FINISHED named by the node;
- the model's streamed text and the messages a flow shows: TEXT_MESSAGE_START, _CONTENT, _END;
- each tool call: TOOL_CALL_START, _ARGS (its arguments as JSON), _END, then TOOL_CALL_RESULT;
- state: STATE_SNAPSHOT of the run's inputs as it starts, STATE_DELTA (a JSON Patch) with each node's
  outputs as it completes, and STATE_SNAPSHOT of the final state;
- a wait for a person: RUN_FINISHED with the interrupt outcome, whose one interrupt says what is
  waited for (its `responseSchema` the answer the next run sends as `answer` in the same session);
- a warning: CUSTOM named `heddle.warning`.

The body may be AG-UI's own RunAgentInput instead (what an AG-UI client such as CopilotKit's
HttpAgent sends): see `run_body`. Refusals before the run starts are POST /v1/runs's JSON errors,
with their status.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from heddle.server.errors import bad_request
from heddle.server.surfaces.stream import first_item, relay, task_of, watched

if TYPE_CHECKING:
    from heddle.engine.events import Event
    from heddle.server.service import Service, Submitted

PROTOCOL = "ag-ui"
_DONE = object()

# What the next run sends as `answer` for each kind of wait, as a JSON Schema.
_ANSWERS: dict[str, dict[str, Any]] = {
    "message": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"],
                "additionalProperties": False},
    "approval": {"oneOf": [
        {"type": "object", "properties": {"approve": {"const": True}, "fingerprint": {"type": "string"}},
         "required": ["approve"], "additionalProperties": False},
        {"type": "object", "properties": {"deny": {"type": "string"}, "fingerprint": {"type": "string"}},
         "required": ["deny"], "additionalProperties": False}]},
    "client_tool": {"type": "object", "properties": {"tool_result": {}, "fingerprint": {"type": "string"}},
                    "required": ["tool_result"], "additionalProperties": False},
}


def interrupt_id(waiting: dict[str, Any]) -> str:
    """The id of the interrupt a wait is: the fingerprint of the call it holds (an answer is bound to it),
    else its kind and node."""
    fingerprint = waiting.get("fingerprint")
    return str(fingerprint) if fingerprint else f"{waiting.get('kind')}:{waiting.get('node')}"


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


class Encoder:
    """heddle's events of one run as AG-UI's, in order."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.text: tuple[str, str] | None = None  # the node streaming text now, and its message id
        self.calls: dict[tuple[str, str, str | None], str] = {}  # open tool calls: (node, tool, call id) -> id
        self.steps: list[str] = []  # nodes started and not yet finished

    def started(self) -> list[dict[str, Any]]:
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}]

    def _close(self) -> list[dict[str, Any]]:
        """What is still open as the run ends (a node that stopped to wait): finished, as AG-UI requires."""
        steps, self.steps = self.steps, []
        return [*self._close_text(), *({"type": "STEP_FINISHED", "stepName": n} for n in reversed(steps))]

    def _step_finished(self, node: str) -> dict[str, Any]:
        if node in self.steps:
            self.steps.remove(node)
        return {"type": "STEP_FINISHED", "stepName": node}

    def _close_text(self) -> list[dict[str, Any]]:
        if self.text is None:
            return []
        _, message_id = self.text
        self.text = None
        return [{"type": "TEXT_MESSAGE_END", "messageId": message_id}]

    def event(self, event: Event) -> list[dict[str, Any]]:
        from heddle.engine import events as ev

        if isinstance(event, ev.TokenDelta):
            if not event.text:
                return []
            out: list[dict[str, Any]] = []
            if self.text is None or self.text[0] != event.node:
                out += self._close_text()
                self.text = (event.node, uuid.uuid4().hex)
                out.append({"type": "TEXT_MESSAGE_START", "messageId": self.text[1], "role": "assistant"})
            return [*out, {"type": "TEXT_MESSAGE_CONTENT", "messageId": self.text[1], "delta": event.text}]
        out = self._close_text()
        if isinstance(event, ev.FlowStart):
            out.append({"type": "STATE_SNAPSHOT", "snapshot": {"inputs": event.inputs, "nodes": {}}})
        elif isinstance(event, ev.NodeStart):
            self.steps.append(event.node)
            out.append({"type": "STEP_STARTED", "stepName": event.node})
        elif isinstance(event, ev.NodeComplete):
            out += [{"type": "STATE_DELTA", "delta": [{"op": "add", "path": f"/nodes/{_pointer(event.node)}",
                                                        "value": event.outputs}]},
                    self._step_finished(event.node)]
        elif isinstance(event, ev.NodeError):
            out.append(self._step_finished(event.node))
        elif isinstance(event, ev.Message):
            message_id = uuid.uuid4().hex
            out += [{"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
                    *([{"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": event.text}]
                      if event.text else []),
                    {"type": "TEXT_MESSAGE_END", "messageId": message_id}]
        elif isinstance(event, ev.ToolCall):
            call_id = event.call_id or uuid.uuid4().hex
            self.calls[(event.node, event.tool, event.call_id)] = call_id
            arguments = json.dumps(event.arguments, ensure_ascii=False, default=str)
            out += [{"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": event.tool},
                    {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments},
                    {"type": "TOOL_CALL_END", "toolCallId": call_id}]
        elif isinstance(event, ev.ToolResult):
            call_id = self.calls.pop((event.node, event.tool, event.call_id), "") or event.call_id or uuid.uuid4().hex
            content = event.output if isinstance(event.output, str) else json.dumps(event.output, ensure_ascii=False,
                                                                                    default=str)
            out.append({"type": "TOOL_CALL_RESULT", "messageId": uuid.uuid4().hex, "toolCallId": call_id,
                        "content": content, "role": "tool"})
        elif isinstance(event, ev.Warning):
            out.append({"type": "CUSTOM", "name": "heddle.warning", "value": event.to_dict()})
        elif isinstance(event, ev.FlowComplete):
            out.append({"type": "STATE_SNAPSHOT", "snapshot": {"state": event.state}})
        return out

    def finished(self, answer: dict[str, Any]) -> list[dict[str, Any]]:
        """The run's end: its result, or the interrupt a person must answer."""
        end: dict[str, Any] = {"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id}
        waiting = answer.get("waiting_for")
        if answer.get("status") == "waiting" and isinstance(waiting, dict):
            kind = str(waiting.get("kind"))
            interrupt: dict[str, Any] = {"id": interrupt_id(waiting), "reason": kind,
                                         "responseSchema": _ANSWERS.get(kind, {}),
                                         "metadata": {"waiting_for": waiting, "session": answer.get("session")}}
            if waiting.get("prompt"):
                interrupt["message"] = str(waiting["prompt"])
            open_call = next((call for (_, tool, _), call in self.calls.items() if tool == waiting.get("tool")), None)
            if open_call is not None:
                interrupt["toolCallId"] = open_call
            end["outcome"] = {"type": "interrupt", "interrupts": [interrupt]}
        else:
            end["result"] = {"outputs": answer.get("outputs", {}), **(
                {"messages": answer["messages"]} if answer.get("messages") else {})}
        return [*self._close(), end]

    def failed(self, code: str, message: str) -> list[dict[str, Any]]:
        return [*self._close(), {"type": "RUN_ERROR", "message": message, "code": code}]


async def _events(submitted: Submitted, queue: asyncio.Queue[Any], thread: str | None, run: str | None
                  ) -> AsyncIterator[list[dict[str, Any]]]:
    """The run's AG-UI events in batches (what the run made meanwhile, together); the run closed at the end
    however it ends."""
    from heddle.server.errors import CANCELLED, run_failure

    encoder = Encoder(thread or submitted.session or uuid.uuid4().hex, run or uuid.uuid4().hex)
    try:
        item = await queue.get()
        if item is _DONE and not submitted.held and not task_of(submitted).cancelled():
            # Refused before it started (a session that does not exist, an answer to nothing): an error of its own.
            task_of(submitted).result()
        batch = [*encoder.started()]
        while item is not _DONE:
            # What the run made meanwhile leaves in the same write: one frame batch, not one a heddle event.
            batch += encoder.event(item)
            item = None
            while not queue.empty():
                item = queue.get_nowait()
                if item is _DONE:
                    break
                batch += encoder.event(item)
                item = None
            yield batch
            batch = []
            if item is None:
                item = await queue.get()
        if batch:
            yield batch
        task = task_of(submitted)
        if task.cancelled():
            yield encoder.failed("cancelled", str(CANCELLED[1]["error"]["message"]))
            return
        failure = task.exception()
        if failure is not None:
            body = run_failure(failure)[1]["error"]
            yield encoder.failed(str(body["type"]), str(body["message"]))
            return
        outcome = await submitted.outcome()  # a session's last event, once its turn is written
        while not queue.empty():
            yield encoder.event(queue.get_nowait())
        yield encoder.finished(submitted.answer(outcome))
    finally:
        await submitted.aclose()


def is_run_agent_input(body: dict[str, Any]) -> bool:
    """Whether `body` is AG-UI's RunAgentInput (whose fields no POST /v1/runs body has)."""
    return "threadId" in body and "runId" in body


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    raise bad_request(f"{where}: give the user's message as text (this agent reads no binary content)")


def run_body(value: dict[str, Any], *, sessions: bool) -> tuple[dict[str, Any], str, str, str | None]:
    """AG-UI's RunAgentInput as POST /v1/runs's body, and the client's thread and run ids.

    With a `--session-store` the thread is a session of it (`POST /v1/sessions` issues its id; without
    one, each run is on its own and the thread only named in its events); the last
    message, the user's, is the run's message (the conversation before it is the session's); a resume
    entry answers the interrupt a run ended with (its id returned, for the caller to check against the
    session's wait); `forwardedProps.inputs` are a flow's inputs."""
    known = {"threadId", "runId", "parentRunId", "protocolVersion", "state", "messages", "tools", "context",
             "forwardedProps", "resume"}
    unknown = sorted(value.keys() - known)
    if unknown:
        raise bad_request(f"RunAgentInput field {unknown[0]!r} is unknown to AG-UI")
    thread, run = value.get("threadId"), value.get("runId")
    if not isinstance(thread, str) or not isinstance(run, str):
        raise bad_request("RunAgentInput: threadId and runId are strings")
    for name, why in (("tools", "frontend tools: the agent's tools are sealed in its bundle"),
                      ("context", "context entries: the agent reads only its message and inputs"),
                      ("state", "a client's state: heddle keeps the run's state itself"),
                      ("parentRunId", "runs nested in others' runs")):
        if value.get(name) not in (None, [], {}):
            raise bad_request(f"RunAgentInput field {name!r}: this server takes no {why}", "not_mapped")
    props = value.get("forwardedProps") or {}
    if not isinstance(props, dict) or props.keys() - {"inputs"}:
        raise bad_request("RunAgentInput field 'forwardedProps': give only {\"inputs\": {...}}, a flow's inputs",
                          "not_mapped")
    body: dict[str, Any] = {"session": thread} if thread and sessions else {}
    if "inputs" in props:
        body["inputs"] = props["inputs"]
    resume = value.get("resume") or []
    if resume:
        if not isinstance(resume, list) or len(resume) != 1 or not isinstance(resume[0], dict):
            raise bad_request("RunAgentInput field 'resume': a run waits for one answer; give one entry")
        entry = resume[0]
        if entry.get("status") == "cancelled":
            body["answer"] = {"deny": "cancelled"}
        elif entry.get("status") == "resolved" and isinstance(entry.get("payload"), dict):
            body["answer"] = entry["payload"]
        else:
            raise bad_request("RunAgentInput 'resume[0]': resolve the interrupt with a payload its responseSchema "
                              "describes, or cancel it")
        return body, thread, run, str(entry.get("interruptId", ""))
    messages = value.get("messages")
    if not isinstance(messages, list):
        raise bad_request("RunAgentInput field 'messages' is a list")
    if messages:
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "user":
            raise bad_request("RunAgentInput 'messages': the last message is the user's, which this run answers")
        body["message"] = _text(last.get("content"), f"RunAgentInput 'messages[{len(messages) - 1}].content'")
    return body, thread, run, None


async def agui_run(service: Service, body: dict[str, Any]) -> AguiRun:
    """The run `body` asks for (POST /v1/runs's body, or AG-UI's RunAgentInput), admitted and started
    (refusals raised as POST /v1/runs raises them)."""
    thread = run = None
    if is_run_agent_input(body):
        body, thread, run, answers = run_body(body, sessions=service.sessions is not None)
        if answers is not None and "session" in body:
            waiting = (await service.session_summary(body["session"])).get("waiting_for")
            if isinstance(waiting, dict) and answers != interrupt_id(waiting):
                raise bad_request(f"RunAgentInput 'resume[0].interruptId' {answers!r}: the run waits for the "
                                  f"interrupt {interrupt_id(waiting)!r}", "stale_answer")
    queue: asyncio.Queue[Any] = asyncio.Queue()
    submitted = await service.submit(body, queue.put_nowait)
    task_of(submitted).add_done_callback(lambda _: queue.put_nowait(_DONE))
    return AguiRun(submitted, queue, thread, run)


class AguiRun:
    """The ASGI answer of one started run in AG-UI's events."""

    def __init__(self, submitted: Submitted, queue: asyncio.Queue[Any], thread: str | None = None,
                 run: str | None = None) -> None:
        self.submitted = submitted
        self.queue = queue
        self.thread = thread
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from heddle.errors import HeddleError
        from heddle.server.body import Gone
        from heddle.server.errors import ApiError, run_failure

        events = _events(self.submitted, self.queue, self.thread, self.run)
        try:
            first = await watched(first_item(events), receive)
        except Gone:
            return
        except (ApiError, HeddleError) as exc:
            status, body = run_failure(exc)
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
            return

        def frames(batch: list[dict[str, Any]]) -> bytes:
            return b"".join(b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":"),
                                                   default=str).encode("utf-8") + b"\n\n" for event in batch)

        await relay(events, first, frames, receive, send)
