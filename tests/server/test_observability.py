"""What an operator sees of `heddle-server`: its spans at the collector the standard variables name (a real
OTLP/HTTP receiver here), a caller's `traceparent` their parent; one log line per request and one per
failure with its cause, in JSON with --log-format json; and the metrics of runs, tools and refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import heddle
from heddle.format.keys import generate
from tests.server.flows import ECHO, tool_chain, write_tools
from tests.server.support import metric, start_server
from tests.support.otlp import otlp_receiver

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TOKEN = "observed-token"


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_server_run_is_traced_logged_and_counted(tmp_path: Path) -> None:
    tools = write_tools(tmp_path / "tools", {"fetch": ECHO, "store": ECHO})
    flow = tool_chain("observed", ["fetch", "store"]).write(tmp_path / "flow.json")
    key = generate(tmp_path / "me", None)
    bundle = heddle.seal(flow, tools_dir=tools, input={"x": "recorded"}, sign_key=key.private_path,
                         output=tmp_path / "app.heddle")
    for name in ("trust", "cache", "home"):
        (tmp_path / name).mkdir()
    with otlp_receiver() as receiver:
        env = {"HEDDLE_TRUST_DIR": str(tmp_path / "trust"), "HEDDLE_CACHE_DIR": str(tmp_path / "cache"),
               "HOME": str(tmp_path / "home"), "HEDDLE_AUTH_TOKEN": TOKEN,
               "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        server = start_server(tmp_path, "--bundle", bundle.path, "--trust", key.public_path, "--log-format", "json",
                              env=env)
        try:
            with server.client(TOKEN) as client:
                answer = client.post("/v1/runs", json={"inputs": {"x": "secret-input-9"}},
                                     headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
                assert answer.status_code == 200, answer.text
                assert client.post("/v1/runs", content=b"{}", headers={"content-type": "text/plain"}
                                   ).status_code == 415
                metrics = client.get("/metrics").text
            with server.client() as anonymous:
                assert anonymous.get("/v1/capabilities").status_code == 401
            spans = receiver.wait_for("POST /v1/runs", "invoke_agent observed", "execute_tool fetch",
                                      "execute_tool store", "heddle.bundle.verify")
        finally:
            assert server.stop() == 0
        log = server.stderr()

    # The caller's span is the parent of the request's, which holds the run's.
    request = next(s for s in spans if s["name"] == "POST /v1/runs" and s["attributes"].get(
        "http.response.status_code") == 200)
    assert request["trace_id"] == CALLER_TRACE and request["parent_span_id"] == CALLER_SPAN
    assert request["kind"] == "server"
    run = next(s for s in spans if s["name"] == "invoke_agent observed")
    assert run["parent_span_id"] == request["span_id"] and run["trace_id"] == CALLER_TRACE
    digest = f"sha256:{bundle.digest}" if not str(bundle.digest).startswith("sha256:") else str(bundle.digest)
    fetch = next(s for s in spans if s["name"] == "execute_tool fetch")
    assert fetch["parent_span_id"] == run["span_id"]
    # Every span of the run names the sealed digest and its signer; a tool's, its input-schema fingerprint.
    for span in (run, fetch):
        assert span["attributes"]["heddle.bundle.digest"] == digest
        assert span["attributes"]["heddle.bundle.signer"] == [key.keyid]
    assert fetch["attributes"]["heddle.tool.schema_fingerprint"].startswith("sha256:")
    verify = next(s for s in spans if s["name"] == "heddle.bundle.verify")
    assert verify["attributes"]["heddle.bundle.digest"] == digest
    assert "secret-input-9" not in json.dumps(spans)

    # One JSON line per request; one more per failure, with its cause; no input, header or token.
    lines = _lines(log)
    ran = [line for line in lines if line.get("path") == "/v1/runs" and line.get("status") == 200]
    assert len(ran) == 1 and ran[0]["trace_id"] == CALLER_TRACE and ran[0]["digest"] == digest
    assert ran[0]["method"] == "POST" and ran[0]["duration_ms"] > 0 and ran[0]["level"] == "info"
    failures = {line["status"]: line for line in lines if "error" in line}
    assert failures[415]["error"] == "unsupported_media_type" and failures[415]["level"] == "warning"
    assert failures[401]["error"] == "unauthorized" and "detail" not in failures[401]
    assert "secret-input-9" not in log and TOKEN not in log

    # The exposition is prometheus-client's: HELP, TYPE and _created; the new series are there.
    assert "# TYPE heddle_tool_call_duration_seconds histogram" in metrics
    assert "heddle_runs_accepted_created" in metrics
    assert metric(metrics, "heddle_tool_call_duration_seconds_count", 'outcome="ok",tool="fetch"') == 1
    assert metric(metrics, "heddle_refusals_total", 'reason="admission"') == 0
    assert metric(metrics, "heddle_run_saturation") == 0


def test_refusals_are_counted_by_reason_and_model_calls_by_a_bounded_model() -> None:
    import asyncio

    from heddle.errors import CallDenied, ToolError
    from heddle.server.metrics import Metrics

    metrics = Metrics(2)
    for error_type in ("busy", "draining", "forbidden_url", "unauthorized", None):
        metrics.answered(error_type)
    metrics.bundle_refused("sha256:" + "0" * 64, "bad_signature", 1.0)

    async def ended(failure: BaseException) -> asyncio.Task[None]:
        async def fail() -> None:
            raise failure

        task = asyncio.get_running_loop().create_task(fail())
        await asyncio.wait({task})
        return task

    for failure in (CallDenied("the person said no"), ToolError("send", "exited 1")):
        metrics.run_ended(asyncio.run(ended(failure)))
    text = metrics.render().decode()
    assert [metric(text, "heddle_refusals_total", f'reason="{r}"') for r in
            ("verification", "egress", "admission", "approval")] == [1, 1, 2, 1]
    # A request flow's models are one label value: a caller never adds a series.
    metrics.observer(from_request=True).model_called("caller-chosen-model", 0.2, {"input": 7, "output": 3}, True)
    metrics.observer(from_request=False).model_called("gpt-sealed", 0.1, {}, False)
    text = metrics.render().decode()
    assert metric(text, "heddle_model_tokens_sum", 'model="(request)",type="input"') == 7
    assert metric(text, "heddle_model_call_duration_seconds_count", 'model="gpt-sealed",outcome="error"') == 1
    assert "caller-chosen-model" not in text
