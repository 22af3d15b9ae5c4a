"""heddle-server and documents whose top level is not a Flow: `outputs` beside `state`, the user's
`message` for an agent document (required there, refused for a flow), and a model URL a request
may not take from the server's environment."""

from __future__ import annotations

from pathlib import Path

from tests.server.flows import write_tools
from tests.support.flows import llm_config, prop, server_tool
from tests.support.server_thread import threaded_server
from tests.support.threaded_model import threaded_model

UPPER = "#!/bin/sh\nread line\necho '{\"loud\": \"HEY\"}'\n"


def test_outputs_beside_state_and_the_message_for_an_agent(tmp_path: Path) -> None:
    tool_node = {"component_type": "ToolNode", "id": "t", "name": "t", "agentspec_version": "25.4.1",
                 "tool": server_tool("upper", [prop("text")], [prop("loud")])}
    with threaded_model([{"content": "Hello Ann!"}]) as model:
        agent = {"component_type": "Agent", "id": "helper", "name": "helper", "agentspec_version": "25.4.1",
                 "inputs": [prop("user")], "llm_config": llm_config(model.url, name="brain"),
                 "system_prompt": "You help {{user}}."}
        # Served from a thread by the command's own entry: the answers are the subject.
        tools = write_tools(tmp_path / "tools", {"upper": UPPER})
        with threaded_server(tmp_path, "--tools-dir", tools, "--allow-net", "127.0.0.1") as server, \
                server.client() as client:
            answer = client.post("/v1/runs", json={"flow": tool_node, "inputs": {"text": "hey"}})
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"flow": "t", "state": {"text": "hey", "loud": "HEY"},
                                     "outputs": {"loud": "HEY"}}
            refused = client.post("/v1/runs", json={"flow": tool_node, "inputs": {"text": "hey"},
                                                    "message": "hi"})
            assert refused.status_code == 400
            assert refused.json()["error"]["message"].startswith("request field 'message': the flow is not "
                                                                 "an agent")
            missing = client.post("/v1/runs", json={"flow": agent, "inputs": {"user": "Ann"}})
            assert missing.status_code == 400
            assert missing.json()["error"]["message"].endswith("give the user's message with 'message' in the "
                                                               "request")
            answer = client.post("/v1/runs", json={"flow": agent, "inputs": {"user": "Ann"}, "message": "hi"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"] == {"result": "Hello Ann!"}
            from_env = {**agent, "llm_config": llm_config("$MODEL_URL", name="brain")}
            refused = client.post("/v1/runs", json={"flow": from_env, "inputs": {"user": "Ann"},
                                                    "message": "hi"})
            assert refused.status_code == 400 and "would read this server's environment" in refused.text
        assert [r["body"]["messages"][1]["content"] for r in model.requests()] == ["hi"]
