"""Streams, run slots, client disconnects and the drain on SIGTERM, with real processes.

The run slots and the run timeout are the service's, not the process's: those two tests serve
from a thread by the command's own entry (tests/support/server_thread.py); the drain, the signals
and the client that hangs up are real `heddle-server` processes."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.flows import ECHO, agent_flow, napper, one_tool_flow, sleeper, write_tools
from tests.server.support import (
    Server,
    metric,
    process_gone,
    raw_request,
    sse_frames,
    start_server,
    wait_for_file,
    wait_gone,
)
from tests.support.flows import server_tool
from tests.support.server_thread import threaded_server
from tests.support.threaded_model import threaded_model


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One server with default settings for the tests that neither stop it nor change its
    limits (a start costs ~0.7 s of CPU); each reads the counters it checks before and after."""
    root = tmp_path_factory.mktemp("lifecycle")
    server, pidfile = _sleeping_server(root)
    yield server, pidfile, root / "flows"
    server.stop()


def _disconnected(server) -> float:
    with server.client() as client:
        text = client.get("/metrics").text
    try:
        return metric(text, "heddle_run_duration_seconds_count", 'outcome="disconnected"')
    except AssertionError:  # no run has ended that way yet: the sample is not written
        return 0.0


def test_sse_frames_of_a_tool_calling_agent_come_in_engine_order(tmp_path, shared):
    server, _, flows = shared
    script = [{"tool_calls": [{"name": "echo", "arguments": {"m": "ping"}}]}, {"content": "pong"}]
    with threaded_model(script) as model:
        agent_flow("agentic", model.url, tools=[server_tool("echo", ["m"])]).write(flows / "agent.json")
        with server.client() as client, client.stream(
                "POST", "/v1/runs", params={"stream": "true"},
                json={"flowPath": "agent.json", "inputs": {"query": "q"}}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            text = "".join(response.iter_text())
    frames = sse_frames(text)
    order = [(e, d.get("node") or d.get("tool")) for e, d in frames if e != "token_delta"]
    assert order == [
        ("flow_start", None),
        ("node_start", "start"), ("node_complete", "start"),
        ("node_start", "agent"),
        ("tool_call", "agent"), ("tool_result", "agent"),
        ("node_complete", "agent"),
        ("node_start", "end"), ("node_complete", "end"),
        ("flow_complete", None),
    ]
    assert all(d["type"] == e for e, d in frames)
    by_type = {e: d for e, d in frames}
    assert by_type["tool_call"]["tool"] == "echo" and by_type["tool_call"]["arguments"] == {"m": "ping"}
    assert by_type["tool_result"]["ok"] is True and by_type["tool_result"]["output"] == {"m": "ping"}
    deltas = "".join(d["text"] for e, d in frames if e == "token_delta")
    assert deltas == "pong"
    # The deltas arrive while the agent runs, not after it.
    types = [e for e, _ in frames]
    assert types.index("tool_result") < types.index("token_delta") < types.index("node_complete", 4)
    assert by_type["flow_complete"]["state"]["result"] == "pong"


def _sleeping_flows(tmp_path: Path) -> tuple[tuple[str | Path, ...], Path]:
    pidfile = tmp_path / "tool.pid"
    tools = write_tools(tmp_path / "tools", {"sleepy": sleeper(pidfile), "echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("sleepy", "sleepy").write(flows / "sleepy.json")
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    return ("--tools-dir", tools, "--flows-root", flows), pidfile


def _sleeping_server(tmp_path: Path, *extra: str) -> tuple[Server, Path]:
    args, pidfile = _sleeping_flows(tmp_path)
    return start_server(tmp_path, *args, *extra), pidfile


SLEEPY = json.dumps({"flowPath": "sleepy.json", "inputs": {"x": 1}}).encode()


def test_a_client_that_hangs_up_cancels_its_run_and_kills_the_tool(shared):
    server, pidfile, _ = shared
    disconnected_before = _disconnected(server)
    for path in ("/v1/runs", "/v1/runs?stream=true"):
        pidfile.unlink(missing_ok=True)
        sock = raw_request(server.port, "POST", path, SLEEPY)
        pid = int(wait_for_file(pidfile))
        assert not process_gone(pid)
        sock.close()
        hung_up = time.monotonic()
        assert wait_gone(pid, 1.0), f"the tool (pid {pid}) outlived its client ({path})"
        assert time.monotonic() - hung_up < 1.0
    with server.client() as client:
        deadline = time.monotonic() + 5
        while metric(client.get("/metrics").text, "heddle_active_runs") and time.monotonic() < deadline:
            time.sleep(0.02)
        text = client.get("/metrics").text
        assert metric(text, "heddle_active_runs") == 0
        assert metric(text, "heddle_run_duration_seconds_count", 'outcome="disconnected"') == \
            disconnected_before + 2
        assert client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 5}}).json()["state"] == {"x": 5}


def test_runs_past_max_concurrent_are_refused_not_queued(tmp_path):
    args, pidfile = _sleeping_flows(tmp_path)
    with threaded_server(tmp_path, *args, "--max-concurrent", "1") as server:
        sock = raw_request(server.port, "POST", "/v1/runs", SLEEPY)
        pid = int(wait_for_file(pidfile))
        with server.client() as client:
            started = time.monotonic()
            response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}})
            assert time.monotonic() - started < 2
            assert response.status_code == 429 and response.json()["error"]["type"] == "busy"
            assert "--max-concurrent 1" in response.json()["error"]["message"]
            assert response.headers["retry-after"] == "1"
            assert client.get("/readyz").status_code == 200
            caps = client.get("/v1/capabilities").json()
            assert caps["runsInFlight"] == 1 and caps["runSaturation"] == 1
            text = client.get("/metrics").text
            assert metric(text, "heddle_runs_rejected_total", 'reason="busy"') == 1
            assert metric(text, "heddle_active_runs") == 1 and metric(text, "heddle_run_saturation") == 1
            # Validation runs nothing, so it needs no slot.
            assert client.post("/v1/validate", json={"flowPath": "echo.json"}).json()["valid"] is True
            sock.close()
            assert wait_gone(pid, 1.0)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}})
                if response.status_code != 429:
                    break
                time.sleep(0.02)
            assert response.status_code == 200


def _post_in_thread(url: str, body: dict, results: list) -> threading.Thread:
    def go() -> None:
        try:
            results.append(httpx.post(f"{url}/v1/runs", json=body, timeout=30))
        except Exception as exc:  # noqa: BLE001 - reported by the test's assertion
            results.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_sigterm_drains_in_flight_runs_refuses_new_ones_and_exits_0(tmp_path):
    marker = tmp_path / "started"
    tools = write_tools(tmp_path / "tools", {"nap": napper(marker, 1.5), "echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("nap", "nap", outputs=("slept",)).write(flows / "nap.json")
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    server = start_server(tmp_path, "--tools-dir", tools, "--flows-root", flows)
    try:
        results: list = []
        thread = _post_in_thread(server.url, {"flowPath": "nap.json", "inputs": {"x": 1}}, results)
        wait_for_file(marker)
        server.signal(signal.SIGTERM)
        with server.client() as client:
            deadline = time.monotonic() + 5
            while client.get("/readyz").status_code != 503 and time.monotonic() < deadline:
                time.sleep(0.01)
            ready = client.get("/readyz")
            assert ready.status_code == 503 and ready.json() == {"status": "draining"}
            health = client.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "draining"
            refused = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": 1}})
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
        thread.join(20)
        assert len(results) == 1 and not isinstance(results[0], Exception), results
        assert results[0].status_code == 200 and results[0].json()["state"]["slept"] is True
        assert server.wait(20) == 0
        assert "SIGTERM: draining (1 run(s) in flight" in server.stderr()
    finally:
        server.stop()


def test_runs_still_going_after_the_drain_timeout_are_cancelled(tmp_path):
    server, pidfile = _sleeping_server(tmp_path, "--drain-timeout", "300")
    try:
        results: list = []
        thread = _post_in_thread(server.url, {"flowPath": "sleepy.json", "inputs": {"x": 1}}, results)
        pid = int(wait_for_file(pidfile))
        signalled = time.monotonic()
        server.signal(signal.SIGTERM)
        assert server.wait(20) == 0
        assert time.monotonic() - signalled < 5
        thread.join(10)
        assert results[0].status_code == 503 and results[0].json()["error"]["type"] == "cancelled"
        assert wait_gone(pid, 1.0)
        assert "--drain-timeout passed: 1 run(s) cancelled" in server.stderr()
    finally:
        server.stop()


def test_a_second_signal_stops_at_once(tmp_path):
    server, pidfile = _sleeping_server(tmp_path)
    try:
        sock = raw_request(server.port, "POST", "/v1/runs?stream=true", SLEEPY)
        pid = int(wait_for_file(pidfile))
        server.signal(signal.SIGTERM)
        time.sleep(0.2)
        assert server.process.poll() is None
        signalled = time.monotonic()
        server.signal(signal.SIGINT)
        assert server.wait(10) == 1
        assert time.monotonic() - signalled < 3
        assert wait_gone(pid, 1.0)
        sock.close()
        assert "SIGINT again: stopping now, 1 run(s) cancelled" in server.stderr()
    finally:
        server.stop()


def test_the_run_timeout_is_a_500_and_stops_the_tool(tmp_path):
    args, pidfile = _sleeping_flows(tmp_path)
    with threaded_server(tmp_path, *args, "--timeout", "400") as server, server.client() as client:
        started = time.monotonic()
        response = client.post("/v1/runs", json={"flowPath": "sleepy.json", "inputs": {"x": 1}})
        assert time.monotonic() - started < 5
        assert response.status_code == 500
        err = response.json()["error"]
        assert err["type"] == "limit_exceeded" and "--timeout 400 ms" in err["message"]
        assert wait_gone(int(pidfile.read_text()), 1.0)
        assert client.get("/v1/capabilities").json()["limits"]["timeoutMs"] == 400
