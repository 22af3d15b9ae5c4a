"""The body of `POST /v1/runs` and `POST /v1/validate`: `{flow | flowPath, inputs, message?, tools?}`, and
for a run in a session `session`, `answer?` and `resume?`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.server.errors import bad_request
from heddle.server.request_code import RequestTool, parse_tools

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.engine.journal import Answer

FIELDS = ("flow", "flowPath", "inputs", "message", "tools")
SESSION_FIELDS = ("session", "answer", "resume")
_KNOWN = frozenset(FIELDS + SESSION_FIELDS)
# Folders on the server are chosen by its operator when it starts, never by a caller.
SERVER_ONLY = {"toolsDir": "--tools-dir", "flowsRoot": "--flows-root"}


@dataclass(frozen=True)
class RunRequest:
    flow: Any = None  # as sent: a document object, or its JSON or YAML text
    flow_path: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    tools: tuple[RequestTool, ...] = ()
    message: str | None = None  # the user's message to an agent document's agent
    session: str | None = None  # an id POST /v1/sessions issued
    answer: Answer | None = None  # the person's answer to what the session's run waits for
    resume: bool = False  # continue the session's interrupted --durable run
    inputs_given: bool = False  # 'inputs' was in the body (a resumed run keeps its own)


def parse_run_request(body: dict[str, Any], *, allow_request_code: bool, sessions: bool | None = None) -> RunRequest:
    """The body as a request. `sessions` says whether the server keeps sessions (without, a request
    naming one is refused); None: the body is not a run's (POST /v1/validate), so it names none."""
    for key, flag in SERVER_ONLY.items():
        if key in body:
            raise bad_request(f"request field {key!r} is not accepted: that folder is set when the server "
                              f"starts ({flag}), never by a request", "forbidden_field")
    unknown = sorted(body.keys() - _KNOWN)
    if unknown:
        raise bad_request(f"request field {unknown[0]!r} is unknown; a request has flow or flowPath, inputs, "
                          "message (for an agent document), tools (with --allow-request-code), and session, "
                          "answer and resume (for a run in a session)")
    session, answer, resume = _session_fields(body, sessions=sessions)
    flow = body.get("flow")
    flow_path = body.get("flowPath")
    if flow is not None and flow_path is not None:
        raise bad_request("the request gives both 'flow' and 'flowPath'; give one")
    if flow_path is not None and not isinstance(flow_path, str):
        raise bad_request(f"request field 'flowPath' must be a string path, not {type(flow_path).__name__}")
    inputs = body.get("inputs", {})
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, dict):
        raise bad_request(f"request field 'inputs' must be a JSON object, not {type(inputs).__name__}")
    message = body.get("message")
    if message is not None and not isinstance(message, str):
        raise bad_request(f"request field 'message' must be a string (the user's message), not "
                          f"{type(message).__name__}")
    tools: tuple[RequestTool, ...] = ()
    if "tools" in body:
        if not allow_request_code:
            raise bad_request("request field 'tools': this server does not run code sent in requests "
                              "(its operator can start it with --allow-request-code)", "request_code_disabled")
        tools = parse_tools(body["tools"])
    return RunRequest(flow=flow, flow_path=flow_path, inputs=inputs, tools=tools, message=message, session=session,
                      answer=answer, resume=resume, inputs_given="inputs" in body)


SESSIONS_OFF = ("this server keeps no sessions (it is stateless); its operator can turn them on with "
                "--session-store sqlite|file|postgres://...")


def _session_fields(body: dict[str, Any], *, sessions: bool | None) -> tuple[str | None, Answer | None, bool]:
    named = [key for key in SESSION_FIELDS if key in body]
    if not named:
        return None, None, False
    from heddle.engine.journal import Answer
    from heddle.sessions.store import check_session_id

    if sessions is None:
        raise bad_request(f"request field {named[0]!r} is for POST /v1/runs; validating runs nothing, so it uses "
                          "no session")
    if not sessions:
        raise bad_request(f"request field {named[0]!r}: {SESSIONS_OFF}", "sessions_off")
    session = body.get("session")
    if session is None:
        raise bad_request(f"request field {named[0]!r} is for a run in a session; give 'session' too (POST "
                          "/v1/sessions issues one)")
    if not isinstance(session, str):
        raise bad_request(f"request field 'session' must be a string (an id POST /v1/sessions issued), not "
                          f"{type(session).__name__}")
    check_session_id(session)
    answer = None
    if body.get("answer") is not None:
        answer = Answer.from_json(body["answer"])
    resume = body.get("resume", False)
    if not isinstance(resume, bool):
        raise bad_request(f"request field 'resume' must be true or false, not {type(resume).__name__}")
    if resume and answer is not None:
        raise bad_request("request fields 'resume' and 'answer': give one; 'answer' resumes a run that waits for "
                          "a person, 'resume' one that was interrupted and waits for nothing")
    return session, answer, resume


def missing_inputs(flow: Flow, inputs: dict[str, Any]) -> list[str]:
    """The StartNode inputs a run would stop on for lack of a value, checked before it starts."""
    start = flow.start_node
    declared = start.inputs or start.outputs
    return [p["title"] for p in declared if p["title"] not in inputs and "default" not in p]
