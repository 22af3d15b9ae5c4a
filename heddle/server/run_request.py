"""The body of `POST /v1/runs` and `POST /v1/validate`: `{flow | flowPath, inputs, message?, tools?}`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.server.errors import bad_request
from heddle.server.request_code import RequestTool, parse_tools

if TYPE_CHECKING:
    from heddle.spec.components import Flow

FIELDS = ("flow", "flowPath", "inputs", "message", "tools")
# Folders on the server are chosen by its operator when it starts, never by a caller.
SERVER_ONLY = {"toolsDir": "--tools-dir", "flowsRoot": "--flows-root"}


@dataclass(frozen=True)
class RunRequest:
    flow: Any = None  # as sent: a document object, or its JSON or YAML text
    flow_path: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    tools: tuple[RequestTool, ...] = ()
    message: str | None = None  # the user's message to an agent document's agent


def parse_run_request(body: dict[str, Any], *, allow_request_code: bool) -> RunRequest:
    for key, flag in SERVER_ONLY.items():
        if key in body:
            raise bad_request(f"request field {key!r} is not accepted: that folder is set when the server "
                              f"starts ({flag}), never by a request", "forbidden_field")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise bad_request(f"request field {unknown[0]!r} is unknown; a request has flow or flowPath, inputs, "
                          "message (for an agent document), and tools (with --allow-request-code)")
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
    return RunRequest(flow=flow, flow_path=flow_path, inputs=inputs, tools=tools, message=message)


def missing_inputs(flow: Flow, inputs: dict[str, Any]) -> list[str]:
    """The StartNode inputs a run would stop on for lack of a value, checked before it starts."""
    start = flow.start_node
    declared = start.inputs or start.outputs
    return [p["title"] for p in declared if p["title"] not in inputs and "default" not in p]
