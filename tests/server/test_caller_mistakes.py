"""A caller's mistake is a 4xx with the usual error body, never a 500: values of the wrong type
for the flow's declared inputs, values a ToolNode's tool refuses, a flow nested too deeply."""

from __future__ import annotations

import json

import pytest

from tests.server.flows import ECHO, write_tools
from tests.server.support import sse_frames
from tests.support.flows import FlowDoc, prop, server_tool
from tests.support.server_thread import threaded_server

JSON = {"Content-Type": "application/json"}


def count_flow(start_type: str | None) -> dict:
    """Start(n) -> ToolNode of a tool whose input n is an integer -> End(n)."""
    f = FlowDoc("count")
    s = f.start([prop("n", start_type) if start_type else {"title": "n"}])
    t = f.tool_node("count", server_tool("echo", [prop("n", "integer")], [prop("n", "integer")]))
    e = f.end([{"title": "n"}])
    f.control(s, t)
    f.control(t, e)
    f.data(s, "n", t, "n")
    f.data(t, "n", e, "n")
    return f.document()


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return body["error"]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    # Served from a thread by the command's own entry: the answers are the subject (400s from a
    # `heddle-server` process: tests/server/test_routes.py; deep bodies: tests/server/test_nesting.py).
    root = tmp_path_factory.mktemp("mistakes")
    with threaded_server(root, "--tools-dir", write_tools(root / "tools", {"echo": ECHO})) as server:
        with server.client() as c:
            yield c
        assert "Traceback" not in server.logged()
        assert server.stop() == 0


def test_inputs_of_the_wrong_type_are_400_before_the_run(client):
    flow = count_flow("integer")
    for value in ("seven", 7.5, [7], None):
        for query in ("", "?stream=true"):
            response = client.post(f"/v1/runs{query}", json={"flow": flow, "inputs": {"n": value}})
            assert response.status_code == 400, (value, response.text)
            err = error_of(response)
            assert err["type"] == "invalid_input" and err["message"].startswith("inputs: n: "), err
            assert "'integer'" in err["message"] and "StartNode" in err["message"]
    response = client.post("/v1/runs", json={"flow": flow, "inputs": {"n": 7}})
    assert response.status_code == 200 and response.json()["state"] == {"n": 7}


def test_values_a_tool_node_refuses_are_422_naming_the_tool(client):
    # The start takes anything; the tool's schema wants an integer.
    flow = count_flow(None)
    response = client.post("/v1/runs", json={"flow": flow, "inputs": {"n": "seven"}})
    assert response.status_code == 422, response.text
    assert error_of(response) == {
        "type": "invalid_tool_input",
        "message": "tool 'echo': input for ToolNode 'count' does not match the tool's inputs: "
                   "n: 'seven' is not of type 'integer'"}
    # Streamed, the answer has begun: the failure is the last frame, with the same type.
    response = client.post("/v1/runs?stream=true", json={"flow": flow, "inputs": {"n": "seven"}})
    assert response.status_code == 200
    assert error_of_stream(response.text)["type"] == "invalid_tool_input"


def error_of_stream(text: str) -> dict:
    event, data = sse_frames(text)[-1]
    assert event == "error" and set(data) == {"error"}, (event, data)
    return data["error"]


@pytest.mark.parametrize("shape", ["object", "json text", "yaml block", "yaml flow"])
def test_a_deeply_nested_inline_flow_is_400(client, shape):
    depth = 5000
    if shape == "object":
        body = b'{"flow": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
    else:
        text = {"json text": '{"a": ' * depth + "1" + "}" * depth,
                "yaml block": "a:\n" + "".join("  " * i + "- \n" for i in range(1, 300)),
                "yaml flow": "a: " + "[" * 300 + "]" * 300}[shape]
        body = json.dumps({"flow": text}).encode()
    response = client.post("/v1/runs", content=body, headers=JSON)
    assert response.status_code == 400, response.text
    assert "nests deeper than" in error_of(response)["message"]
    response = client.post("/v1/validate", content=body, headers=JSON)
    assert response.status_code == 400 and "nests deeper than" in error_of(response)["message"]
