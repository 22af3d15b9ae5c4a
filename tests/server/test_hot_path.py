"""What every request pays, kept to what it must: a request's flow known by the text the body wrote (not
encoded again), the body read as strictly as before, a tool's metric series looked up once, and the access
log's route found as the router finds it. In-process (httpx.ASGITransport)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from heddle.canonical import loads_strict, loads_strict_members
from heddle.server import flow_cache
from heddle.server.access import AccessLog
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.metrics import Metrics
from heddle.server.service import Service
from tests.server.flows import tool_chain


class _NoEncoding:
    def encode(self, value: Any) -> str:
        raise AssertionError("a request's flow was encoded again to be known")


def test_a_request_flow_is_known_by_the_text_the_body_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tool_chain("plain", []).document()
    monkeypatch.setattr(flow_cache, "_KEY_ENCODER", _NoEncoding())
    service = Service(ServerConfig())

    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                for x in ("a", "b"):
                    body = json.dumps({"flow": doc, "inputs": {"x": x}})
                    response = await client.post("/v1/runs", content=body, headers={"content-type": "application/json"})
                    assert response.status_code == 200, response.text
                    assert response.json()["outputs"] == {"x": x}
                assert len(service.flows) == 1
                # The same document written otherwise is known by its own text: read and kept on its own.
                body = json.dumps({"inputs": {"x": "c"}, "flow": doc}, indent=1)
                response = await client.post("/v1/runs", content=body, headers={"content-type": "application/json"})
                assert response.status_code == 200 and response.json()["outputs"] == {"x": "c"}
                assert len(service.flows) == 2
        finally:
            await service.aclose()

    asyncio.run(main())


TEXTS = ['{"flow": {"a": [1, 2.5, {"b": null}]}, "inputs": {"x": "\\u00e9"}}', ' { "a" : 1 } \n', "{}",
         '{"a": 1, "a": 2}', '{"a": {"b": 1, "b": 2}}', '{"a": NaN}', '{"a": 1e999}', '{"a": -Infinity}', '{"a": 1,}',
         '{"a" 1}', '{"a": 1 "b": 2}', '{"a": 1} x', '{"a":', '{1: 2}', '[1, {"a": 1}]', '"text"', "\ufeff{}", ""]


@pytest.mark.parametrize("text", TEXTS)
def test_a_body_read_with_its_members_is_read_as_strictly_as_before(text: str) -> None:
    def outcome(read: Any) -> tuple[Any, ...]:
        try:
            return ("read", read(text))
        except ValueError as exc:
            return (type(exc).__name__, str(exc))

    assert outcome(lambda t: loads_strict_members(t)[0]) == outcome(loads_strict)
    try:
        value, members = loads_strict_members(text)
    except ValueError:
        return
    if isinstance(value, dict):
        assert list(members) == list(value) and all(loads_strict(members[k]) == value[k] for k in value)


def test_a_tools_metric_series_are_looked_up_once_and_only_those_used(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics(4)
    looked_up: list[dict[str, str]] = []
    real = metrics.tool_calls.labels

    def labels(**names: str) -> Any:
        looked_up.append(names)
        return real(**names)

    monkeypatch.setattr(metrics.tool_calls, "labels", labels)
    for _ in range(3):
        metrics.tool_called("fetch", True)
    metrics.tool_called("fetch", False, 12.0)
    assert looked_up == [{"tool": "fetch", "outcome": "ok"}, {"tool": "fetch", "outcome": "error"}]
    text = metrics.render().decode()
    assert 'heddle_tool_calls_total{outcome="ok",tool="fetch"} 3.0' in text
    # A call without a duration makes no duration series of its own.
    assert 'heddle_tool_call_duration_seconds_count{outcome="ok",tool="fetch"}' not in text
    assert 'heddle_tool_call_duration_seconds_count{outcome="error",tool="fetch"} 1.0' in text


def test_the_access_logs_route_is_the_one_the_router_would_take() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    routes = [Route("/v1/runs", app), Route("/v1/sessions/{session_id}", app), Route("/v1/sessions/new", app),
              Route("/healthz", app)]
    log = AccessLog(app, metrics=Metrics(1), routes=routes)
    assert log.route("/v1/runs") == "/v1/runs" and log.route("/healthz") == "/healthz"
    # A path an earlier route's pattern takes is that route's, as the router matches in order.
    assert log.route("/v1/sessions/new") == "/v1/sessions/{session_id}"
    assert log.route("/v1/sessions/abc") == "/v1/sessions/{session_id}"
    assert log.route("/nowhere") is None


def test_a_server_leaves_what_start_up_made_out_of_the_collectors_passes_and_its_log_lines_gather_only_what_they_show(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.server import serve as serving

    # The process-wide switches this test's process must get back as they were.
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    seen: list[int] = []

    def run(self: Any, sockets: Any = None) -> None:
        seen.append(gc.get_freeze_count())

    monkeypatch.setattr(serving.DrainingServer, "run", run)
    service = Service(ServerConfig(host="127.0.0.1", port=0))
    level = logging.getLogger("heddle").level
    try:
        assert serving.serve(service, on_ready=lambda url: None) == 0
    finally:
        gc.unfreeze()
        logging.getLogger("heddle").setLevel(level)
        asyncio.run(service.aclose())
    assert seen and seen[0] > 0
    assert logging._srcfile is None and not (logging.logThreads or logging.logProcesses or logging.logMultiprocessing)


def test_a_flow_sent_again_is_known_by_its_text_and_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle import canonical

    doc = tool_chain("plain", []).document()
    other = tool_chain("plain", []).document()
    other["name"] = "other"  # the same first characters, another text
    read: list[int] = []
    counting = json.JSONDecoder(object_pairs_hook=lambda pairs: read.append(1) or canonical._no_dupes(pairs),
                                parse_constant=canonical._bad_constant, parse_float=canonical._finite)
    monkeypatch.setattr(canonical, "_STRICT", counting)
    service = Service(ServerConfig())

    async def post(client: httpx.AsyncClient, body: str) -> httpx.Response:
        read.clear()
        return await client.post("/v1/runs", content=body, headers={"content-type": "application/json"})

    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                first = await post(client, json.dumps({"flow": doc, "inputs": {"x": "a"}}))
                assert first.status_code == 200 and len(read) > 3
                # Sent again: its inputs are read, the document is not.
                again = await post(client, json.dumps({"inputs": {"x": "b"}, "flow": doc}))
                assert again.status_code == 200 and again.json()["outputs"] == {"x": "b"}
                assert len(read) == 1
                # One that begins alike but differs is read and kept on its own.
                response = await post(client, json.dumps({"flow": other, "inputs": {"x": "c"}}))
                assert response.status_code == 200 and response.json()["flow"] == "other" and len(read) > 3
                assert len(service.flows) == 2
                # A known text as another member's value is that member's value, read as before.
                response = await post(client, json.dumps({"flow": doc, "inputs": doc}))
                assert response.status_code == 400 and "'x'" in response.json()["error"]["message"]
                # Its entry let go, a known text is read again as the body wrote it.
                service.flows = type(service.flows)()
                response = await post(client, json.dumps({"flow": doc, "inputs": {"x": "d"}}))
                assert response.status_code == 200 and response.json()["outputs"] == {"x": "d"}
        finally:
            await service.aclose()

    asyncio.run(main())


def test_a_known_flow_text_is_dropped_with_its_entry() -> None:
    from heddle.server.flow_cache import FlowCache, KnownFlow, Ready

    cache = FlowCache(max_entries=1)
    text = json.dumps({"component_type": "Flow", "name": "n" * 80})
    cache.put("k1", Ready(flow=None, edition=None, run=object()), text=text)  # type: ignore[arg-type]
    body = f'{{"flow": {text}}}'
    found = cache.known(body, 9)
    assert found == (KnownFlow(text, "k1"), len(body) - 1)
    assert cache.known(body.replace('n"}', 'm"}'), 9) is None
    cache.put("k2", Ready(flow=None, edition=None, run=object()))  # type: ignore[arg-type]
    assert cache.known(body, 9) is None


def test_a_run_that_waits_on_nothing_runs_on_its_requests_own_task(tmp_path: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.settings import RunSettings
    from tests.server.flows import ECHO, write_tools

    service = Service(ServerConfig(tools_dir=write_tools(tmp_path / "tools", {"echo": ECHO})))
    tasks: list[str] = []
    start = service.runs.start
    monkeypatch.setattr(service.runs, "start", lambda work, **kw: tasks.append("run") or start(work, **kw))

    async def post(client: httpx.AsyncClient, doc: Any, inputs: Any) -> httpx.Response:
        return await client.post("/v1/runs", content=json.dumps({"flow": doc, "inputs": inputs}),
                                 headers={"content-type": "application/json"})

    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                plain = tool_chain("plain", []).document()
                response = await post(client, plain, {"x": "a"})
                assert response.status_code == 200 and response.json()["outputs"] == {"x": "a"}
                assert tasks == [] and service.admission.active == 0
                # Its failure is answered as a run's task's is (here, over --max-iterations).
                few = Service(ServerConfig(settings=RunSettings(max_iterations=1)))
                try:
                    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(few)),
                                                 base_url="http://127.0.0.1") as other:
                        response = await post(other, plain, {"x": "a"})
                        assert response.json()["error"]["type"] == "limit_exceeded", response.text
                        assert response.status_code == 500 and "--max-iterations 1" in response.text
                        assert few.admission.active == 0
                finally:
                    await few.aclose()
                # A tool's run has a task of its own, which draining cancels and the client's leaving stops.
                response = await post(client, tool_chain("tooled", ["echo"]).document(), {"x": "b"})
                assert response.status_code == 200 and response.json()["outputs"] == {"x": "b"}
                assert tasks == ["run"]
        finally:
            await service.aclose()

    asyncio.run(main())
