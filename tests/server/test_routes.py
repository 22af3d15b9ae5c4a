"""Every route and error status of a server running request flows, against the real server."""

from __future__ import annotations

import json

import pytest

from tests.server.flows import ECHO, FAIL, one_tool_flow, write_tools
from tests.server.support import metric, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    tools = write_tools(root / "tools", {"echo": ECHO, "fail": FAIL})
    flows = root / "flows"
    flows.mkdir()
    one_tool_flow("echo-flow", "echo").write(flows / "echo.json")
    (flows / "sub").mkdir()
    one_tool_flow("echo-yaml", "echo").write(flows / "sub" / "echo.yaml")
    one_tool_flow("fails", "fail").write(flows / "fail.json")
    one_tool_flow("missing-tool", "nowhere").write(flows / "missing.json")
    (root / "secret.json").write_text(json.dumps(one_tool_flow("secret", "echo").document()))
    (flows / "escape.json").symlink_to(root / "secret.json")
    server = start_server(root, "--tools-dir", tools, "--flows-root", flows, "--max-concurrent", "3")
    with server.client() as client:
        yield server, client, root
    server.stop()


JSON = {"Content-Type": "application/json"}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return body["error"]


def test_health_and_readiness(served):
    _, client, _ = served
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "version": "0.1.0"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}


def test_capabilities_describe_the_server(served):
    _, client, _ = served
    caps = client.get("/v1/capabilities").json()
    assert caps["version"] == "0.1.0" and caps["allowRequestCode"] is False and caps["acceptsFlowPath"] is True
    assert caps["tools"] == ["echo", "fail"] and caps["protocols"] == ["heddle", "ag-ui"]
    assert caps["sandbox"] == {"safe": False, "backend": "auto", "denyNet": False}
    assert caps["limits"]["maxConcurrent"] == 3 and caps["limits"]["timeoutMs"] == 300000
    assert caps["runsInFlight"] == 0 and caps["runSaturation"] == 0
    assert "bundle" not in caps


def test_a_run_by_flow_path_and_inline(served):
    _, client, root = served
    response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": "héllo"}})
    assert response.status_code == 200, response.text
    # issue 11: the flow's outputs come beside its final state
    assert response.json() == {"flow": "echo-flow", "state": {"x": "héllo"}, "outputs": {"x": "héllo"}}
    response = client.post("/v1/runs", json={"flowPath": "sub/echo.yaml", "inputs": {"x": 1}})
    assert response.json()["flow"] == "echo-yaml"
    doc = one_tool_flow("inline", "echo").document()
    response = client.post("/v1/runs", json={"flow": doc, "inputs": {"x": [1, 2]}})
    assert response.status_code == 200 and response.json()["state"] == {"x": [1, 2]}
    response = client.post("/v1/runs", json={"flow": json.dumps(doc), "inputs": {"x": 3}})
    assert response.json()["state"] == {"x": 3}


def test_malformed_requests_are_400_naming_the_field(served):
    _, client, _ = served
    cases = [
        (b"{nope", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, not list"),
        (b'{"flowPath": "echo.json", "flowPath": "x"}', "duplicate key 'flowPath'"),
        (b'{"flowPath": "echo.json", "inputs": [1]}', "'inputs' must be a JSON object, not list"),
        (b'{"flowPath": "echo.json", "speed": 1}', "request field 'speed' is unknown"),
        (b'{"flowPath": "echo.json", "flow": {}}', "both 'flow' and 'flowPath'"),
        (b'{"inputs": {}}', "names no flow"),
        # issue 11: an Agent may be the top level now; a lone tool may not
        (b'{"flow": {"component_type": "Agent"}}', "$.llm_config: Field required"),
        (b'{"flow": {"component_type": "ServerTool", "name": "t"}}', "heddle runs a Flow, an Agent or a single node"),
        (b'{"flow": "a: *x"}', "YAML"),
        (b'{"flow": 7}', "must be a flow document"),
        (b'{"flowPath": "echo.json", "inputs": {"x": "\\ud800"}}', "lone surrogate"),
        (b'{"flowPath": "echo.json", "inputs": {"x": NaN}}', "NaN is not allowed"),
        (b'{"flowPath": "echo.json", "inputs": {"x": -1e999}}', "-1e999 is not a finite number"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"flowPath": "echo.json", "tools": []}', "does not run code sent in requests"),
        (b'{"flowPath": "echo.json", "toolsDir": "/bin"}', "'toolsDir' is not accepted"),
        (b'{"flowPath": "echo.json", "flowsRoot": "/"}', "'flowsRoot' is not accepted"),
    ]
    for body, expected in cases:
        response = client.post("/v1/runs", content=body, headers=JSON)
        assert response.status_code == 400, (body, response.text)
        assert expected in error_of(response)["message"], (body, response.text)
    assert error_of(client.post("/v1/runs", json={"flowPath": "echo.json", "toolsDir": "t"}))["type"] == \
        "forbidden_field"
    response = client.post("/v1/runs?stream=maybe", json={"flowPath": "echo.json"})
    assert response.status_code == 400 and "stream='maybe'" in error_of(response)["message"]


def test_missing_input_and_missing_tool_are_400_before_anything_runs(served):
    _, client, _ = served
    response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {}})
    assert response.status_code == 400
    err = error_of(response)
    assert err["type"] == "missing_input" and "needs 'x'" in err["message"]
    response = client.post("/v1/runs?stream=true", json={"flowPath": "missing.json", "inputs": {"x": 1}})
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    err = error_of(response)
    assert err["type"] == "invalid_flow" and "ServerTool 'nowhere' has no executable" in err["message"]


def test_flow_path_escapes_are_404_without_telling_what_exists(served):
    _, client, root = served
    messages = set()
    for path in ["../secret.json", "/etc/passwd", str(root / "secret.json"), "escape.json", "nope.json",
                 "sub/../../secret.json", "sub", ""]:
        response = client.post("/v1/runs", json={"flowPath": path, "inputs": {"x": 1}})
        assert response.status_code == 404, (path, response.text)
        err = error_of(response)
        assert err["type"] == "flow_not_found"
        messages.add(err["message"].replace(repr(path), "PATH"))
    assert len(messages) == 1


def test_a_failing_run_is_500_with_the_tool_named(served):
    _, client, _ = served
    response = client.post("/v1/runs", json={"flowPath": "fail.json", "inputs": {"x": 1}})
    assert response.status_code == 500
    assert error_of(response) == {"type": "tool_failed",
                                  "message": "tool 'fail': exited with status 3: disk on fire"}


def test_a_failure_after_the_stream_opened_ends_with_an_error_frame(served):
    from tests.server.support import sse_frames

    _, client, _ = served
    response = client.post("/v1/runs?stream=true", json={"flowPath": "fail.json", "inputs": {"x": 1}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = sse_frames(response.text)
    events = [e for e, _ in frames]
    assert events[0] == "flow_start" and events[-2] == "node_error" and events[-1] == "error"
    assert frames[-1][1] == {"error": {"type": "tool_failed",
                                       "message": "tool 'fail': exited with status 3: disk on fire"}}


def test_validate_reports_without_running(served):
    _, client, _ = served
    report = client.post("/v1/validate", json={"flowPath": "echo.json"}).json()
    assert report["valid"] is True and report["flow"] == "echo-flow" and report["problems"] == []
    assert [t["name"] for t in report["tools"]] == ["echo"] and report["tools"][0]["fingerprint"].startswith("sha256:")
    report = client.post("/v1/validate", json={"flowPath": "missing.json"}).json()
    assert report["valid"] is False and "ServerTool 'nowhere' has no executable" in report["problems"][0]
    response = client.post("/v1/validate", json={"flow": {"component_type": "Flow"}})
    assert response.status_code == 400 and error_of(response)["type"] == "invalid_flow"
    assert client.post("/v1/validate", json={"flowPath": "../secret.json"}).status_code == 404


def test_unknown_routes_wrong_methods_and_big_bodies(served):
    _, client, _ = served
    response = client.get("/v2/nothing")
    assert response.status_code == 404 and error_of(response)["type"] == "not_found"
    response = client.get("/v1/runs")
    assert response.status_code == 405 and error_of(response)["type"] == "method_not_allowed"
    assert response.headers["allow"] == "POST"
    assert client.delete("/healthz").status_code == 405
    big = b'{"flowPath": "echo.json", "inputs": {"x": "' + b"a" * (1 << 20) + b'"}}'
    response = client.post("/v1/runs", content=big, headers=JSON)
    assert response.status_code == 413 and error_of(response)["type"] == "body_too_large"

    def chunks():
        yield b'{"inputs": {"x": "'
        for _ in range(20):
            yield b"b" * 65536
        yield b'"}}'

    response = client.post("/v1/validate", content=chunks(), headers=JSON)
    assert response.status_code == 413


def test_openapi_describes_every_route(served):
    _, client, _ = served
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/capabilities",
                                 "/v1/validate", "/v1/runs", "/v1/tools", "/v1/sessions", "/v1/sessions/{session_id}",
                                 "/v1/sessions/{session_id}/events"}
    runs = doc["paths"]["/v1/runs"]["post"]
    assert set(runs["responses"]) >= {"200", "400", "404", "413", "429", "500", "503"}
    assert "text/event-stream" in runs["responses"]["200"]["content"]


def test_metrics_count_runs_and_tool_calls(served):
    _, client, _ = served
    client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}})
    client.post("/v1/runs", json={"flowPath": "fail.json", "inputs": {"x": 1}})
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert metric(text, "heddle_active_runs") == 0
    assert metric(text, "heddle_max_concurrent_runs") == 3
    assert metric(text, "heddle_run_saturation") == 0
    assert metric(text, "heddle_runs_accepted_total") >= 2
    assert metric(text, "heddle_tool_calls_total", 'outcome="ok",tool="echo"') >= 1
    assert metric(text, "heddle_tool_calls_total", 'outcome="error",tool="fail"') >= 1
    assert metric(text, "heddle_run_duration_seconds_count", 'outcome="ok"') >= 1
    assert metric(text, "heddle_run_duration_seconds_count", 'outcome="error"') >= 1
    assert "process_resident_memory_bytes" in text and "heddle_runs_rejected_total" in text
