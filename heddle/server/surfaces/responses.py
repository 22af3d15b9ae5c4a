"""The served agent as an OpenAI Responses API model: `POST /v1/responses` and `GET /v1/models`.

A request is one turn of the agent: `input` is the user's message (text, or one user message item),
or the answer to what the conversation waits for (an `mcp_approval_response` item for an approval, a
`function_call_output` item for a ClientTool, a user message for a question). `previous_response_id`
continues the conversation from its latest response: a response's id is `resp_` and the handle of its
session (heddle.server.surfaces.agent), so any replica sharing the store continues it.

The agent's tool calls are `mcp_call` output items (its tools run on the server, as a remote MCP
server's do), a call that waits for approval an `mcp_approval_request` item, a ClientTool's call a
`function_call` item, and its answer a `message` item. Streamed (`"stream": true`), the same items
come as the Responses API's server-sent events. What the sealed agent decides (instructions, tools,
sampling, reasoning, output limits) is not a request's to change: a request that sets it is refused,
naming the field. Errors are the Responses API's: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from heddle.blocking import Tasks
from heddle.errors import HeddleError
from heddle.server.errors import ApiError, as_api_error
from heddle.server.surfaces.agent import Reply, ServedAgent
from heddle.server.surfaces.stream import first_item, relay, watched

if TYPE_CHECKING:
    from starlette.routing import BaseRoute
    from starlette.types import Receive, Scope, Send

    from heddle.engine.events import Event
    from heddle.engine.journal import WaitingFor
    from heddle.server.service import Service

RESPONSE_PREFIX = "resp_"
# The request fields heddle reads; any other given a value is refused by name (the sealed agent decides it).
_READ = frozenset({"model", "input", "stream", "previous_response_id", "store", "metadata"})
_EMPTY_OK = {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "include": [], "background": False,
             "truncation": "disabled"}
# The OpenAI error class of a status: these two, else a server error from 500 on and a request's below.
_TYPES = {401: "authentication_error", 429: "rate_limit_error"}


def error_response(status: int, code: str, message: str, *, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """An error in the Responses API's shape (its `type` the OpenAI error class of the status)."""
    type_ = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


def _refused(exc: ApiError | HeddleError) -> Response:
    api = exc if isinstance(exc, ApiError) else as_api_error(exc)
    return error_response(api.status, api.type, api.message, headers=api.headers or None)


class _Bad(Exception):
    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_request",
                 status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def _approval_id(waiting: WaitingFor) -> str:
    return "mcpr_" + hashlib.sha256(f"{waiting.node}\0{waiting.fingerprint}".encode()).hexdigest()[:32]


def _call_id(waiting: WaitingFor) -> str:
    return "call_" + hashlib.sha256(f"{waiting.node}\0{waiting.fingerprint}".encode()).hexdigest()[:32]


def _text(content: Any, where: str) -> str:
    """A user message's content: text, or its input_text parts (other parts are not mapped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _Bad(f"{where}.content[{i}] is {kind!r}; this agent reads text (input_text) only",
                           param=f"{where}.content")
            texts.append(part["text"])
        return "".join(texts)
    raise _Bad(f"{where}.content must be text or a list of input_text parts", param=f"{where}.content")


class _Turn:
    """What one request asks: the user's message, or the answer to a wait, and the conversation it continues."""

    def __init__(self, message: str | None = None, answer_item: dict[str, Any] | None = None) -> None:
        self.message = message
        self.answer_item = answer_item


def _read_input(raw: Any) -> _Turn:
    if isinstance(raw, str):
        return _Turn(message=raw)
    if not isinstance(raw, list) or len(raw) != 1 or not isinstance(raw[0], dict):
        raise _Bad("input must be the user's message (text, or one message item) or one answer item "
                   "(mcp_approval_response, function_call_output); earlier turns are kept by the server: continue "
                   "them with previous_response_id", param="input")
    item = raw[0]
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") != "user":
            raise _Bad(f"input[0] is a {item.get('role')!r} message; this agent takes the user's message (its "
                       "instructions are sealed with it)", param="input[0].role")
        return _Turn(message=_text(item.get("content"), "input[0]"))
    if kind in ("mcp_approval_response", "function_call_output"):
        return _Turn(answer_item=item)
    raise _Bad(f"input[0] is of type {kind!r}, which this agent does not take", param="input[0].type")


def _answer(turn: _Turn, waiting: WaitingFor | None) -> dict[str, Any] | None:
    """The answer to the wait the conversation is at, from the turn; None when the turn is a new message."""
    item = turn.answer_item
    if waiting is None:
        if item is not None:
            raise _Bad(f"input[0] is an {item.get('type')} but the conversation waits for nothing", param="input",
                       code="not_waiting")
        return None
    if waiting.kind == "approval":
        if item is None or item.get("type") != "mcp_approval_response":
            raise _Bad(f"the conversation waits for the approval {_approval_id(waiting)} of the call of "
                       f"{waiting.tool!r}: send an mcp_approval_response item", param="input", code="waiting")
        if item.get("approval_request_id") != _approval_id(waiting):
            raise _Bad(f"approval_request_id {item.get('approval_request_id')!r} is not the approval the "
                       f"conversation waits for ({_approval_id(waiting)})", param="input[0].approval_request_id")
        approve = item.get("approve")
        if not isinstance(approve, bool):
            raise _Bad("input[0].approve must be true or false", param="input[0].approve")
        if approve:
            return {"approve": True, "fingerprint": waiting.fingerprint}
        return {"deny": str(item.get("reason") or "not approved"), "fingerprint": waiting.fingerprint}
    if waiting.kind == "client_tool":
        if item is None or item.get("type") != "function_call_output":
            raise _Bad(f"the conversation waits for the output of the function call {_call_id(waiting)} "
                       f"({waiting.tool!r}): send a function_call_output item", param="input", code="waiting")
        if item.get("call_id") != _call_id(waiting):
            raise _Bad(f"call_id {item.get('call_id')!r} is not the call the conversation waits for "
                       f"({_call_id(waiting)})", param="input[0].call_id")
        output = item.get("output")
        if not isinstance(output, str):
            raise _Bad("input[0].output must be text (JSON text is read as JSON)", param="input[0].output")
        try:
            result: Any = json.loads(output)
        except ValueError:
            result = output
        return {"tool_result": result, "fingerprint": waiting.fingerprint}
    if turn.message is None:
        raise _Bad(f"the conversation waits for the user's answer to {waiting.prompt!r}: send it as the "
                   "user's message", param="input", code="waiting")
    return {"message": turn.message}


class _Transcript:
    """A run's events as Responses output items, each handed to `emit` (a stream's events) as it changes."""

    def __init__(self, agent: ServedAgent, emit: Callable[[dict[str, Any]], None] | None, *,
                 started: asyncio.Event | None = None) -> None:
        from heddle.agentspec.roots import message_target

        self.started = started  # set at the run's first event

        target = message_target(agent.flow)
        self.speaker = target.name if target is not None else None
        self.label = agent.name
        self.items: list[dict[str, Any]] = []
        self._emit = emit
        self._open: dict[str, Any] | None = None  # the message item whose text is streaming
        self._calls: dict[str, dict[str, Any]] = {}
        self._n = 0

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n:04d}"

    def emit(self, event: dict[str, Any]) -> None:
        if self._emit is not None:
            self._emit(event)

    def _add(self, item: dict[str, Any]) -> int:
        self.items.append(item)
        index = len(self.items) - 1
        self.emit({"type": "response.output_item.added", "output_index": index, "item": item})
        return index

    def _done(self, item: dict[str, Any]) -> None:
        self.emit({"type": "response.output_item.done", "output_index": self.items.index(item), "item": item})

    def on_event(self, event: Event) -> None:
        from heddle.engine import events as ev

        if self.started is not None:
            self.started.set()
        if isinstance(event, ev.TokenDelta) and event.node == self.speaker:
            self._delta(event.text)
        elif isinstance(event, ev.ToolCall):
            self._close()
            item: dict[str, Any] = {
                "type": "mcp_call", "id": self._id("mcp"), "server_label": self.label, "name": event.tool,
                "arguments": json.dumps(event.arguments, ensure_ascii=False, default=str), "output": None,
                    "error": None, "status": "in_progress"}
            self._calls[event.call_id or event.tool] = item
            self._add(item)
        elif isinstance(event, ev.ToolResult):
            done = self._calls.pop(event.call_id or event.tool, None)
            if done is None:
                return
            output = event.output if isinstance(event.output, str) else json.dumps(event.output, ensure_ascii=False,
                                                                                   default=str)
            done.update({"output": output if event.ok else None, "error": None if event.ok else output,
                         "status": "completed" if event.ok else "failed"})
            self._done(done)

    def _delta(self, text: str) -> None:
        if self._open is None:
            self._open = {"type": "message", "id": self._id("msg"), "status": "in_progress", "role": "assistant",
                          "content": []}
            index = self._add(self._open)
            part = {"type": "output_text", "text": "", "annotations": []}
            self._open["content"].append(part)
            self.emit({"type": "response.content_part.added", "item_id": self._open["id"], "output_index": index,
                       "content_index": 0, "part": dict(part)})
        part = self._open["content"][0]
        part["text"] += text
        self.emit({"type": "response.output_text.delta", "item_id": self._open["id"],
                   "output_index": self.items.index(self._open), "content_index": 0, "delta": text, "logprobs": []})

    def _close(self) -> str | None:
        """End the streaming message item; its text."""
        item, self._open = self._open, None
        if item is None:
            return None
        index, part = self.items.index(item), item["content"][0]
        self.emit({"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                   "content_index": 0, "text": part["text"], "logprobs": []})
        self.emit({"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                   "content_index": 0, "part": part})
        item["status"] = "completed"
        self._done(item)
        return str(part["text"])

    def say(self, text: str) -> None:
        """A whole message item (one the run showed, or its answer when it was not streamed)."""
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"type": "message", "id": self._id("msg"), "status": "completed", "role": "assistant",
                "content": [part]}
        self._add(item)
        self._done(item)

    def end(self, reply: Reply, conversational: bool) -> None:
        """The run's end: what it showed, then its answer, or the item for what it waits for."""
        outcome = reply.outcome
        streamed = self._close()
        waiting = outcome.waiting
        messages = list(outcome.messages)
        if waiting is not None and waiting.kind == "message" and messages and messages[-1] == waiting.prompt:
            messages.pop()  # the question, shown as the wait's own item below
        for text in messages:
            self.say(text)
        if waiting is None:
            answer = outcome.outputs.get("result")
            text = answer if conversational and isinstance(answer, str) else json.dumps(
                outcome.outputs, ensure_ascii=False, default=str)
            if text != streamed:
                self.say(text)
            return
        arguments = json.dumps(waiting.arguments or {}, ensure_ascii=False)
        if waiting.kind == "approval":
            item = {"type": "mcp_approval_request", "id": _approval_id(waiting), "server_label": self.label,
                    "name": waiting.tool, "arguments": arguments}
        elif waiting.kind == "client_tool":
            item = {"type": "function_call", "id": "fc_" + _call_id(waiting)[5:], "call_id": _call_id(waiting),
                    "name": waiting.tool, "arguments": arguments, "status": "completed"}
        else:
            self.say(waiting.prompt or f"The run waits for your answer (node {waiting.node!r}).")
            return
        self._add(item)
        self._done(item)


class ResponsesSurface:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.agent = ServedAgent(service)

    @property
    def model_id(self) -> str:
        return self.agent.name

    def model(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "heddle",
                "heddle": self.agent.proof()}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self.model()]})

    async def one_model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model_id:
            return error_response(404, "model_not_found", f"The model {request.path_params['model']!r} does not "
                                  f"exist; this server serves {self.model_id!r}", param="model")
        return JSONResponse(self.model())

    def _check(self, body: dict[str, Any]) -> None:
        for key, value in body.items():
            if key in _READ or value is None or _EMPTY_OK.get(key, object()) == value:
                continue
            raise _Bad(f"{key} is not mapped: the sealed agent {self.model_id!r} decides it, and a request may not "
                       "change it; leave it out", param=key, code="unsupported_parameter")
        if body.get("model") != self.model_id:
            raise _Bad(f"The model {body.get('model')!r} does not exist; this server serves {self.model_id!r}",
                       param="model", code="model_not_found", status=404)
        if not self.agent.conversational:
            raise _Bad(f"{self.model_id!r} is a flow that takes inputs, not an agent that takes a message; run it "
                       "with POST /v1/runs or over MCP", param="model", code="not_an_agent")
        for key, kind in (("stream", bool), ("store", bool), ("previous_response_id", str), ("metadata", dict)):
            if key in body and body[key] is not None and not isinstance(body[key], kind):
                raise _Bad(f"{key} must be a {kind.__name__}", param=key)
        if body.get("store") is False and body.get("previous_response_id") is not None:
            raise _Bad("store false keeps nothing of this turn, so it cannot continue a conversation; drop one of "
                       "store and previous_response_id", param="store")

    async def create(self, request: Request) -> Response | _Relayed:
        from heddle.server.body import read_json_object

        try:
            body = await read_json_object(request, self.service.config.max_body_bytes)
            self._check(body)
            turn = _read_input(body.get("input"))
            previous = body.get("previous_response_id")
            session, waiting = None, None
            if previous is not None:
                if not previous.startswith(RESPONSE_PREFIX):
                    raise ApiError(404, "unknown_response", f"previous_response_id {previous!r} is not a response "
                                                            "of this server")
                session, waiting = await self.agent.latest(previous[len(RESPONSE_PREFIX):],
                                                           what=f"previous_response_id {previous!r}")
            answer = _answer(turn, waiting)
        except _Bad as bad:
            return error_response(bad.status, bad.code, bad.message, param=bad.param)
        except (ApiError, HeddleError) as exc:
            return _refused(exc)
        call = _Call(self, body, session=session, message=None if answer is not None else turn.message,
                     answer=answer)
        if body.get("stream"):
            return await call.streamed(request.receive)
        return await call.answered()


class _Call:
    """One request's run, answered whole or streamed."""

    def __init__(self, surface: ResponsesSurface, body: dict[str, Any], *, session: str | None,
                 message: str | None, answer: dict[str, Any] | None) -> None:
        self.surface = surface
        self.body = body
        self.session = session
        self.message = message
        self.answer = answer
        self.created = int(time.time())
        self.sequence = 0

    def response(self, status: str, items: list[dict[str, Any]], rid: str | None) -> dict[str, Any]:
        return {"id": rid or "resp_pending", "object": "response", "created_at": self.created, "status": status,
                "model": self.surface.model_id, "output": items, "error": None, "incomplete_details": None,
                "instructions": None, "metadata": self.body.get("metadata") or {}, "parallel_tool_calls": True,
                "previous_response_id": self.body.get("previous_response_id"), "store": self.body.get("store", True),
                "temperature": None, "top_p": None, "tool_choice": "auto", "tools": [], "usage": None,
                "text": {"format": {"type": "text"}}, "truncation": "disabled"}

    def _rid(self, reply: Reply) -> str:
        if reply.handle is not None:
            return RESPONSE_PREFIX + reply.handle
        # A turn kept nowhere (store false, or a server without sessions): an id nothing continues.
        import secrets

        return RESPONSE_PREFIX + "x" + secrets.token_hex(16)

    async def _run(self, transcript: _Transcript) -> Reply:
        agent = self.surface.agent
        reply = await agent.run(inputs={}, message=self.message, session=self.session, answer=self.answer,
                                on_event=transcript.on_event, keep=self.body.get("store", True) is not False)
        transcript.end(reply, agent.conversational)
        return reply

    async def answered(self) -> Response:
        transcript = _Transcript(self.surface.agent, None)
        try:
            reply = await self._run(transcript)
        except (ApiError, HeddleError) as exc:
            return _refused(exc)
        return JSONResponse(self.response("completed", transcript.items, self._rid(reply)))

    def _frame(self, event: dict[str, Any]) -> bytes:
        self.sequence += 1
        data = {**event, "sequence_number": self.sequence}
        return f"event: {event['type']}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()

    async def streamed(self, receive: Receive) -> Response | _Relayed:
        """The run's events as they come. The status line waits for the run's first event, so a refusal
        before it starts (full, draining, a missing input) is answered with its own status. The client is
        watched throughout, as /v1/runs watches it: one that leaves stops the run at once, not at the
        next frame written."""
        frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        started = asyncio.Event()

        def emit(event: dict[str, Any]) -> None:
            frames.put_nowait(self._frame(event))

        transcript = _Transcript(self.surface.agent, emit, started=started)
        head = [self._frame({"type": "response.created", "response": self.response("in_progress", [], None)}),
                self._frame({"type": "response.in_progress", "response": self.response("in_progress", [], None)})]
        # The run outlives this call (its frames are relayed after): the server's, which its end stops.
        run = self.surface.service.runs.start(self._run(transcript), name="responses run")
        waits = Tasks()
        begun = waits.start(started.wait())
        try:
            await watched(asyncio.wait({run, begun}, return_when=asyncio.FIRST_COMPLETED), receive)
        except BaseException:
            run.cancel()
            await asyncio.wait({run})
            raise
        finally:
            await waits.aclose()
        if run.done() and not started.is_set():
            failure = run.exception()
            if isinstance(failure, (ApiError, HeddleError)):
                return _refused(failure)
            if failure is not None:
                raise failure
        return _Relayed(self._relay(run, transcript, frames, head))

    async def _relay(self, run: asyncio.Task[Reply], transcript: _Transcript, frames: asyncio.Queue[bytes | None],
                     head: list[bytes]) -> AsyncIterator[bytes]:
        run.add_done_callback(lambda _: frames.put_nowait(None))
        try:
            for frame in head:
                yield frame
            while True:
                more = await frames.get()
                if more is None:
                    break
                yield more
            await asyncio.wait({run})
            failure = None if run.cancelled() else run.exception()
            if run.cancelled() or failure is not None:
                api = (as_api_error(failure) if isinstance(failure, HeddleError) else failure
                       if isinstance(failure, ApiError) else ApiError(500, "internal_error", "the run failed; see the "
                                                                                             "server log"))
                failed = self.response("failed", transcript.items, None)
                failed["error"] = {"code": api.type, "message": api.message}
                yield self._frame({"type": "response.failed", "response": failed})
                return
            yield self._frame({"type": "response.completed",
                               "response": self.response("completed", transcript.items, self._rid(run.result()))})
        finally:
            if not run.done():
                run.cancel()
                await asyncio.wait({run})


class _Relayed:
    """A streamed response's frames, sent as they come (heddle.server.surfaces.stream.relay)."""

    def __init__(self, frames: AsyncIterator[bytes]) -> None:
        self.frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from heddle.server.body import Gone

        try:
            first = await watched(first_item(self.frames), receive)
        except Gone:
            return  # the client left before the first frame: its run is stopped, and no one hears an answer
        await relay(self.frames, first, bytes, receive, send)


def routes(service: Service) -> list[BaseRoute]:
    """`/v1/responses` and `/v1/models`, when the server serves responses."""
    from starlette.routing import Route

    surface = ResponsesSurface(service)
    return [Route("/v1/responses", surface.create, methods=["POST"]),
            Route("/v1/models", surface.models, methods=["GET"]),
            Route("/v1/models/{model}", surface.one_model, methods=["GET"])]
