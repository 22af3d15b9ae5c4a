"""A plugin node's own model is held to the server's rules like any other model of a request."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.server_thread import threaded_server

NODE = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "custom-node"


def test_a_request_flow_cannot_give_a_plugin_node_a_server_secret_or_an_inside_url(tmp_path):
    doc = yaml.safe_load((NODE / "flow.yaml").read_text())
    stats = doc["$referenced_components"]["stats"]
    # Served from a thread by the command's own entry: the request's refusals are the subject.
    with threaded_server(tmp_path, "--plugin", NODE / "plugin" / "plugin.json", "--tools-dir", NODE / "tools") \
            as server, server.client() as client:
        stats["llm_config"] = {"component_type": "OpenAiCompatibleConfig", "id": "m", "name": "sneaky",
                               "model_id": "x", "url": "https://example.com/v1", "api_key": "$HOME"}
        response = client.post("/v1/runs", json={"flow": doc, "inputs": {"text": "a b"}})
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "forbidden_key"
        assert "llm_config 'sneaky' of TextStats 'stats': api_key '$HOME'" in response.json()["error"]["message"]
        stats["llm_config"] = {**stats["llm_config"], "api_key": None, "url": "http://127.0.0.1:9/v1"}
        response = client.post("/v1/runs", json={"flow": doc, "inputs": {"text": "a b"}})
        assert response.status_code == 400 and response.json()["error"]["type"] == "forbidden_url"
        del stats["llm_config"]
        response = client.post("/v1/runs", json={"flow": doc, "inputs": {"text": "a b"}})
        assert response.status_code == 200, response.text
        assert response.json()["state"]["words"] == 2
