"""A2AAgent: one turn of the conversation with an agent served elsewhere over A2A 1.0 (the `a2a-sdk`
client, heddle's optional extra `a2a`, imported only when a document holds an A2AAgent).

As the reference runtime does it: the user's message goes to `agent_url` (JSON-RPC, no agent card
fetched) as a text message in the conversation's context (one context id for every turn of a
session); the task the remote agent makes is polled every `poll_interval` seconds until it is
completed or needs input, for at most the session's `timeout`, a failed poll retried at most
`max_retries` times in a row; a task failed, canceled or rejected ends the run. The remote agent's
last message (text parts as they are, data parts as JSON) is the turn's answer.

A task that needs input is a wait of heddle's (a message, its prompt the remote agent's question):
in a session the run stops there, and the answer goes to the same task in the same context. Each
exchange is kept in the session's journal, so a resumed run sends nothing twice.

Every answer is read within --max-response-bytes once decoded (heddle.bounded), each request within
connection_config's `timeout` as a whole; headers written `$NAME` are read from the environment where
the run starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.bounded import ACCEPT_ENCODING, BodyError, read_body
from heddle.engine.journal import WaitingFor
from heddle.engine.tracing import REQUEST_HOOKS
from heddle.errors import RunError, UsageError
from heddle.secret_env import header_from_env

if TYPE_CHECKING:
    import httpx

    from heddle.engine.context import RunContext

_DONE = "TASK_STATE_COMPLETED"
_ASKS = "TASK_STATE_INPUT_REQUIRED"
_ENDED = {"TASK_STATE_FAILED": "failed", "TASK_STATE_CANCELED": "was canceled", "TASK_STATE_REJECTED": "was rejected"}


@dataclass(frozen=True)
class Reply:
    """What one exchange with the remote agent gave: the task's state and last message."""

    state: str  # _DONE or _ASKS (a direct message is _DONE)
    text: str
    context_id: str
    task_id: str | None


def _label(agent: c.A2AAgent) -> str:
    return f"A2AAgent {agent.name!r} ({agent.agent_url})"


def _headers(agent: c.A2AAgent) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in (agent.connection_config.headers or {}).items():
        variable = c.env_reference(value)
        headers[name] = value if variable is None else header_from_env(_label(agent), name, variable, os.environ)
    return headers


def _verify(agent: c.A2AAgent) -> Any:
    config = agent.connection_config
    if not config.verify:
        return False  # the document's own choice, as the reference runtime takes it
    if not (config.ssl_ca_cert or config.cert_file):
        return True
    import ssl

    try:
        context = ssl.create_default_context(cafile=config.ssl_ca_cert)
        if config.cert_file and config.key_file:
            context.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"A2AConnectionConfig {config.name!r} of {_label(agent)}: cannot load its certificates: "
                         f"{exc}") from None
    return context


def _capped(inner: httpx.AsyncBaseTransport, cap: int, cap_text: str) -> httpx.AsyncBaseTransport:
    """`inner` whose every answer is read whole here, within `cap` bytes once decoded."""
    import httpx


    class Capped(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await inner.handle_async_request(request)
            try:
                body = await read_body(response, what=f"{request.method} {request.url}", cap=cap, cap_text=cap_text)
            except BodyError as exc:
                raise httpx.ReadError(exc.message, request=request) from None
            finally:
                await response.aclose()
            headers = [(k, v) for k, v in response.headers.raw
                       if k.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")]
            return httpx.Response(response.status_code, headers=headers, content=body, request=request,
                                  extensions=response.extensions)

        async def aclose(self) -> None:
            await inner.aclose()

    return Capped()


def _part_text(agent: c.A2AAgent, part: Any) -> str:
    kind = part.WhichOneof("content")
    if kind == "text":
        return str(part.text)
    if kind == "data":
        from a2a.helpers.proto_helpers import get_data_parts

        return json.dumps(get_data_parts([part])[0], ensure_ascii=False)
    raise RunError(f"{_label(agent)}: the remote agent answered with a {kind} part, which heddle passes on only as "
                   "text")


def _message_text(agent: c.A2AAgent, message: Any) -> str:
    return "".join(_part_text(agent, part) for part in message.parts)


def _task_reply(agent: c.A2AAgent, task: Any) -> Reply:
    # The remote agent's last message: the task's status message, else the last of its history.
    from a2a.types.a2a_pb2 import Role, TaskState

    messages = [m for m in task.history if m.role == Role.ROLE_AGENT]
    if task.status.HasField("message"):
        messages.append(task.status.message)
    if messages:
        text = _message_text(agent, messages[-1])
    else:
        text = "".join(_part_text(agent, p) for artifact in task.artifacts for p in artifact.parts)
    state = TaskState.Name(task.status.state)
    return Reply(state, text, task.context_id, task.id)


class _Remote:
    """The client of one turn: sends a message and polls its task as the session parameters say."""

    def __init__(self, ctx: RunContext, agent: c.A2AAgent, client: Any) -> None:
        self.ctx, self.agent, self.client = ctx, agent, client
        self.timeout = agent.connection_config.timeout

    async def _call(self, what: str, work: Any) -> Any:
        try:
            async with asyncio.timeout(self.timeout):
                return await work
        except TimeoutError:
            raise RunError(f"{_label(self.agent)}: {what} got no answer within "
                           f"{self.timeout:g} seconds (connection_config.timeout)") from None
        except Exception as exc:  # noqa: BLE001 - whatever the remote answer makes the client raise is this failure
            from a2a.utils.errors import A2AError

            detail = _one_line(exc) if isinstance(exc, A2AError) else \
                f"its answer is not one the A2A protocol defines ({_one_line(exc)})"
            cause = exc.__cause__
            if cause is not None and not str(cause).strip():
                detail = f"{detail} {type(cause).__name__} (the connection ended without a word)"
            raise RunError(f"{_label(self.agent)}: {what} failed: {detail}") from None

    async def send(self, text: str, context_id: str, task_id: str | None) -> Reply:
        from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageConfiguration, SendMessageRequest

        message = Message(message_id=uuid.uuid4().hex, context_id=context_id, role=Role.ROLE_USER,
                          parts=[Part(text=text)])
        if task_id is not None:
            message.task_id = task_id
        # The task comes back at once and is polled, as session_parameters say.
        request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(return_immediately=True))

        async def first() -> Any:
            async for event in self.client.send_message(request):
                return event
            raise ValueError("the remote agent sent no answer")

        event = await self._call("sending the message", first())
        if event.HasField("message"):
            return Reply(_DONE, _message_text(self.agent, event.message), event.message.context_id or context_id,
                         None)
        return await self._poll(_task_reply(self.agent, event.task))

    def _settled(self, reply: Reply) -> bool:
        """Whether the task is done with for this exchange: completed or asking (True), still going (False)."""
        if reply.state in _ENDED:
            why = f": {_one_line(reply.text)}" if reply.text else ""
            raise RunError(f"{_label(self.agent)}: the remote task {_ENDED[reply.state]}{why}")
        return reply.state in (_DONE, _ASKS)

    async def _poll(self, reply: Reply) -> Reply:
        """As the reference runtime polls: at once, then every poll_interval until the session's timeout,
        a failed poll retried while there were at most max_retries in a row."""
        from a2a.types.a2a_pb2 import GetTaskRequest

        params = self.agent.session_parameters
        if self._settled(reply):
            return reply
        deadline = time.monotonic() + params.timeout
        failures = 0
        while time.monotonic() < deadline:
            try:
                task = await self._call("polling its task", self.client.get_task(GetTaskRequest(id=reply.task_id)))
            except RunError:
                failures += 1
                if failures > params.max_retries:
                    raise
            else:
                failures = 0
                reply = _task_reply(self.agent, task)
                if self._settled(reply):
                    return reply
            await asyncio.sleep(params.poll_interval)
        raise RunError(f"{_label(self.agent)}: the remote task did not finish within "
                       f"{params.timeout:g} seconds (session_parameters.timeout)")


def _one_line(text: object, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters (a remote agent's words go into an error line)."""
    line = " ".join(str(text).split()) or type(text).__name__
    return line if len(line) <= limit else line[:limit] + "…"


async def _exchange(ctx: RunContext, remote: _Remote, text: str, context_id: str, task_id: str | None) -> Reply:
    """One message and its answer; in a session, the journal's when it holds it (nothing is sent again)."""
    journal = ctx.journal
    key = journal.key("a") if journal is not None else ""
    if journal is not None:
        found, value = journal.recorded(key)
        if found:
            return Reply(**value)
    reply = await remote.send(text, context_id, task_id)
    if journal is not None:
        journal.record(key, asdict(reply))
    return reply


def _client(agent: c.A2AAgent, http: httpx.AsyncClient) -> Any:
    from a2a.client import ClientConfig, ClientFactory, minimal_agent_card

    config = ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=["JSONRPC"])
    return ClientFactory(config).create(minimal_agent_card(agent.agent_url, ["JSONRPC"]))


async def run_a2a_agent(ctx: RunContext, node: c.AgentNode, agent: c.A2AAgent) -> dict[str, Any]:
    """One turn: the user's message to the remote agent, its answer the turn's (and the node's `result`)."""
    try:
        import a2a.client  # noqa: F401
    except ImportError:
        raise UsageError(f"{_label(agent)}: talking to an A2A agent needs the a2a-sdk package; install heddle with "
                         "its a2a extra (pip install 'heddle[a2a]')") from None
    import httpx

    top = ctx.message
    if top is None or top.node is not node:
        raise RunError(f"{_label(agent)}: an A2AAgent runs only as the document's top level")
    key = agent.id or agent.name
    kept = ctx.conversation.agents.get(key, []) if ctx.conversation is not None else []
    context_id = str(kept[0].get("context_id")) if kept else uuid.uuid4().hex
    options = ctx.options
    inner = httpx.AsyncHTTPTransport(verify=_verify(agent), trust_env=False)
    transport = _capped(inner, options.max_response_bytes,
                        f"raise {options.surface.flag('max_response_bytes')} if it needs more")
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(agent.connection_config.timeout),
                                 headers={"Accept-Encoding": ACCEPT_ENCODING, **_headers(agent)},
                                 follow_redirects=False, trust_env=False,
                                 event_hooks={"request": [options.egress.hook(agent.name, httpx.ConnectError),
                                                          *REQUEST_HOOKS["request"]]}
                                 if options.egress is not None else None) as http:
        remote = _Remote(ctx, agent, _client(agent, http))
        reply = await _exchange(ctx, remote, top.text, context_id, None)
        while reply.state == _ASKS:
            # The remote agent asks the user: heddle's wait; the answer continues the same task.
            answer = ctx.wait(WaitingFor("message", node.name, prompt=reply.text))
            reply = await _exchange(ctx, remote, answer.message or "", reply.context_id, reply.task_id)
    top.answer = reply.text
    if ctx.conversation is not None:
        ctx.conversation.agents[key] = [{"context_id": reply.context_id}]
    return {"result": reply.text}
