"""An MCPTool's and an MCPToolBox's `retry_policy`, against a real MCP server on stdio that lists its
tool only from its Nth listing and answers the first M calls with "Unknown tool". The reference
behaviour (WayFlow 26.3.1) each test holds is stated in it; attempts are counted, never timed (the
policies' delays are a millisecond, without jitter)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from tests.support.flows import FlowDoc, llm_config, prop
from tests.support.inproc import URL, refusal, run_doc, served_model

# A standard-library MCP server (JSON-RPC lines on stdio): argv = log file, the listing from which it
# lists `add`, how many calls of `add` it answers "Unknown tool" first. Each request is logged.
SERVER = '''
import json, sys
log, list_from, fail_calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
listings = calls = 0
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    with open(log, "a") as f:
        f.write(method + "\\n")
    answer = {"jsonrpc": "2.0", "id": msg["id"]}
    if method == "initialize":
        answer["result"] = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                            "serverInfo": {"name": "flaky", "version": "1"}}
    elif method == "tools/list":
        listings += 1
        schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}
        tools = [{"name": "broken", "description": "Fails.", "inputSchema": schema}]
        if listings >= list_from:
            tools.append({"name": "add", "description": "Add two numbers.", "inputSchema": schema})
        answer["result"] = {"tools": tools}
    elif method == "tools/call" and params["name"] == "broken":
        answer["result"] = {"content": [{"type": "text", "text": "the adder is broken"}], "isError": True}
    elif method == "tools/call":
        calls += 1
        if calls <= fail_calls:
            answer["error"] = {"code": -32602, "message": "Unknown tool: add"}
        else:
            total = params["arguments"]["a"] + params["arguments"]["b"]
            answer["result"] = {"content": [{"type": "text", "text": str(total)}]}
    else:
        answer["result"] = {}
    print(json.dumps(answer), flush=True)
'''

FAST = {"initial_retry_delay": 0.001, "max_retry_delay": 0.001, "jitter": None}


def _transport(tmp_path: Path, list_from: int, fail_calls: int) -> dict[str, Any]:
    script = tmp_path / "flaky.py"
    script.write_text(SERVER)
    return {"component_type": "StdioTransport", "id": "flaky", "name": "flaky", "command": sys.executable,
            "args": [str(script), str(tmp_path / "requests.log"), str(list_from), str(fail_calls)],
            "session_parameters": {"read_timeout_seconds": 20}}


def _requests(tmp_path: Path) -> list[str]:
    return (tmp_path / "requests.log").read_text().split()


def _flow(tmp_path: Path, transport: dict[str, Any], policy: dict[str, Any] | None, tool: str = "add") -> Path:
    ab = [prop("a", "integer"), prop("b", "integer")]
    mcp_tool: dict[str, Any] = {"component_type": "MCPTool", "id": "mcp-add", "name": tool,
                                "client_transport": transport, "inputs": ab, "outputs": [prop("total")]}
    if policy is not None:
        mcp_tool["retry_policy"] = policy
    f = FlowDoc("flaky", version="26.3.1")  # retry_policy on MCP: 26.3.1
    start = f.start(ab)
    node = f.tool_node("sum", mcp_tool, inputs=ab)
    end = f.end([prop("total")])
    f.control(start, node)
    f.control(node, end)
    return f.write(tmp_path / "flow.json")


def test_an_mcp_tool_is_looked_for_and_called_again_as_its_policy_says(tmp_path: Path) -> None:
    # WayFlow: resolving the tool lists the server's tools again while `add` is missing (up to
    # max_attempts + 1 listings), and a call that fails "Unknown tool" is made again, separately.
    flow = _flow(tmp_path, _transport(tmp_path, list_from=3, fail_calls=2), {"max_attempts": 3, **FAST})
    assert dict(run_doc(flow, None, {"a": 40, "b": 2}))["total"] == "42"
    requests = _requests(tmp_path)
    assert requests.count("tools/list") == 3 and requests.count("tools/call") == 3


def test_attempts_end_where_the_policy_says(tmp_path: Path) -> None:
    # max_attempts 1: two listings, then the tool is missing; two calls, then the call fails.
    code, error = refusal(_flow(tmp_path, _transport(tmp_path, list_from=3, fail_calls=0),
                                {"max_attempts": 1, **FAST}), None, {"a": 1, "b": 1})
    assert code != 0 and "lists no tool 'add'" in error
    assert _requests(tmp_path).count("tools/list") == 2
    (tmp_path / "requests.log").unlink()
    code, error = refusal(_flow(tmp_path, _transport(tmp_path, list_from=1, fail_calls=5),
                                {"max_attempts": 1, **FAST}), None, {"a": 1, "b": 1})
    assert code != 0 and "tool 'add'" in error and "Unknown tool: add" in error
    assert _requests(tmp_path).count("tools/call") == 2


def test_without_a_policy_nothing_is_asked_twice(tmp_path: Path) -> None:
    code, error = refusal(_flow(tmp_path, _transport(tmp_path, list_from=2, fail_calls=0), None),
                          None, {"a": 1, "b": 1})
    assert code != 0 and "lists no tool 'add'" in error
    assert _requests(tmp_path).count("tools/list") == 1
    (tmp_path / "requests.log").unlink()
    code, error = refusal(_flow(tmp_path, _transport(tmp_path, list_from=1, fail_calls=1), None),
                          None, {"a": 1, "b": 1})
    assert code != 0 and _requests(tmp_path).count("tools/call") == 1


def test_a_tool_s_own_error_answer_is_not_retried(tmp_path: Path) -> None:
    # WayFlow retries a call's failure, not a result the tool marks as an error.
    code, error = refusal(_flow(tmp_path, _transport(tmp_path, list_from=1, fail_calls=0),
                                {"max_attempts": 3, **FAST}, tool="broken"), None, {"a": 1, "b": 1})
    assert code != 0 and "the adder is broken" in error
    assert _requests(tmp_path).count("tools/call") == 1


def test_a_toolbox_policy_holds_for_its_filter_and_each_call(tmp_path: Path) -> None:
    # A toolbox with a tool_filter is listed again while a tool it names is missing, and each call of
    # its tools is retried under its policy.
    toolbox = {"component_type": "MCPToolBox", "id": "box", "name": "box",
               "client_transport": _transport(tmp_path, list_from=2, fail_calls=1), "tool_filter": ["add"],
               "retry_policy": {"max_attempts": 2, **FAST}}
    f = FlowDoc("flaky-box", version="26.3.1")
    start = f.start([])
    agent = f.agent("helper", llm_config(URL), inputs=[], outputs=["result"])
    f.components[agent]["agent"]["toolboxes"] = [toolbox]
    end = f.end(["result"])
    f.control(start, agent)
    f.control(agent, end)
    script = [{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}, {"content": "done"}]
    events: list[ev.Event] = []
    with served_model(script) as model:
        state = dict(run_doc(f.write(tmp_path / "flow.json"), None, {}, transport=model.transport, events=events))
        replies = [m["content"] for m in model.requests()[1]["body"]["messages"] if m["role"] == "tool"]
    assert state["result"] == "done" and json.loads(replies[0]) == {"result": "3"}
    requests = _requests(tmp_path)
    assert requests.count("tools/list") == 2 and requests.count("tools/call") == 2
    assert [(e.tool, e.ok) for e in events if isinstance(e, ev.ToolResult)] == [("add", True)]


@pytest.mark.parametrize(("policy", "expected"), [
    ({"max_attempts": -1}, "max_attempts"),
    ({"initial_retry_delay": 5, "max_retry_delay": 1}, "max_retry_delay must be greater than or equal"),
    ({"jitter": "sometimes"}, "jitter"),
    ({"retries": 3}, "retries"),
])
def test_a_policy_the_specification_refuses_is_refused(tmp_path: Path, policy: dict[str, Any], expected: str) -> None:
    from heddle.errors import DocumentError
    from heddle.agentspec import load_flow

    with pytest.raises(DocumentError) as caught:
        load_flow(_flow(tmp_path, _transport(tmp_path, 1, 0), policy))
    assert expected in str(caught.value) and "retry_policy" in str(caught.value)


def test_the_waits_follow_the_policy() -> None:
    import random

    from heddle.agentspec.components import RetryPolicy
    from heddle.tools.retry import call_retry, recoverable_status, wait_before

    plain = RetryPolicy(initial_retry_delay=1, backoff_factor=2, max_retry_delay=5, jitter=None)
    assert [wait_before(plain, n, None) for n in range(4)] == [1, 2, 4, 5]
    fixed = random.Random(7)
    half = RetryPolicy(initial_retry_delay=2, max_retry_delay=2, jitter="full_and_equal_for_throttle")
    assert 1 <= wait_before(half, 0, 429, fixed) <= 2  # equal jitter for a 4xx
    assert all(recoverable_status(RetryPolicy(), s, "") for s in (409, 429, 500, 503))
    assert not any(recoverable_status(RetryPolicy(), s, "") for s in (400, 401, 403, 404, 422, 501))
    codes = RetryPolicy(recoverable_statuses={"409": ["busy"]})
    assert recoverable_status(codes, 409, "Busy, later") and not recoverable_status(codes, 409, "conflict")
    assert call_retry(RetryPolicy(), ValueError("no")) == (False, None)
