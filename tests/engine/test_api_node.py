"""ApiNode against a real HTTP server on 127.0.0.1 (port 0): the request filled from the node's
inputs as WayFlow 26.3.1's ApiCallStep fills it, its answer read as WayFlow reads it, a
RemoteTool's rules for its url, headers and $VAR, and a session that resumes without sending it
again. The reference behaviour each test holds is stated in it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from heddle.errors import DocumentError
from heddle.settings import RunSettings
from tests.support.cli import error_line, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, prop
from tests.support.inproc import refusal, run_doc


@dataclass
class Api:
    """An HTTP API that records every request and answers by path."""

    base: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # path -> 503 answers still to give

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]


def _handler(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length).decode("utf-8") if length else ""
            api.requests.append({"method": self.command, "path": parts.path, "raw": self.path,
                                 "query": parse_qs(parts.query, keep_blank_values=True),
                                 "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
            path = parts.path
            if api.failures.get(path, 0) > 0:
                api.failures[path] -= 1
                self._send(503, "text/plain", "busy, try again")
            elif path.startswith("/echo"):
                self._send(200, "application/json", json.dumps({
                    "method": self.command, "path": self.path, "body": body, "response": "the response key",
                    "auth": self.headers.get("authorization"), "kind": self.headers.get("content-type"),
                    "nothing": None}))
            elif path == "/text":
                self._send(200, "text/plain; charset=utf-8", "plain words")
            elif path == "/list":
                self._send(200, "application/json", "[1, 2]")
            elif path == "/missing":
                self._send(404, "application/json", '{"error": "no such city"}')
            else:
                self._send(500, "text/plain", "unexpected path")

        def _send(self, status: int, kind: str, text: str) -> None:
            data = text.encode("utf-8")
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

    return Handler


@pytest.fixture(scope="module")
def served() -> Iterator[Api]:
    api = Api()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    server.daemon_threads = True
    api.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield api
    server.shutdown()
    server.server_close()


@pytest.fixture
def api(served: Api) -> Api:
    served.requests.clear()
    served.failures.clear()
    return served


def api_flow(tmp_path: Path, url: str, *, inputs: list[Any] | None = None, outputs: list[Any] | None = None,
             **fields: Any) -> Path:
    """start -> ApiNode `call` -> end, the end giving the node's outputs. Without `inputs` or
    `outputs` the node declares none (the key is left out), so the reader infers them."""
    ins = [prop(i) if isinstance(i, str) else i for i in inputs or []]
    outs = [prop(o) if isinstance(o, str) else o for o in outputs or []]
    f = FlowDoc("api")
    s = f.start(ins)
    a = f._node("ApiNode", "call", ins, outs, url=url, http_method=fields.pop("http_method", "GET"), **fields)
    e = f.end(outs if outputs is not None else ["response"])
    f.control(s, a)
    f.control(a, e)
    if outputs is None:
        del f.components[a]["outputs"]
    if inputs is None:
        del f.components[a]["inputs"]
    return f.write(tmp_path / "flow.json")


def _out(state: dict[str, Any], *titles: str) -> dict[str, Any]:
    return {title: state[title] for title in titles}


def test_the_request_is_filled_from_the_inputs_as_wayflow_fills_it(tmp_path, api, monkeypatch):
    # WayFlow: a url value is quote_plus'd (a space is "+", "/" is %2F); a value fills a template as
    # str() writes it (True); dict data goes as compact JSON with Content-Type application/json;
    # sensitive_headers are sent; each declared output is the answer's key of its title.
    monkeypatch.setenv("API_TOKEN", "Bearer s3cret")
    flow = api_flow(tmp_path, api.base + "/echo/{{city}}", inputs=["city", prop("flag", "boolean")],
                    http_method="post", query_params={"flag": "{{flag}}", "fixed": 1, "many": ["a", "{{city}}"]},
                    headers={"X-Flag": "f-{{flag}}"}, sensitive_headers={"Authorization": "$API_TOKEN"},
                    data={"city": "{{city}}", "count": 2, "flag": "{{flag}}"},
                    outputs=["method", "path", "auth", "kind", prop("http_status_code", "integer")])
    state = run_doc(flow, inputs={"city": "São Paulo/1", "flag": True})
    seen = api.requests[0]
    assert seen["method"] == "POST" and seen["raw"].startswith("/echo/S%C3%A3o+Paulo%2F1?")
    assert seen["query"] == {"flag": ["True"], "fixed": ["1"], "many": ["a", "São Paulo/1"]}
    assert seen["body"] == '{"city":"São Paulo/1","count":2,"flag":"True"}'
    assert seen["headers"]["content-type"] == "application/json" and seen["headers"]["x-flag"] == "f-True"
    assert state["auth"] == "Bearer s3cret" and state["method"] == "POST" and state["http_status_code"] == 200


def test_bodies_as_wayflow_sends_them(tmp_path, api):
    # A string that is JSON once filled goes as JSON (Content-Type application/json); any other goes
    # as written, without a Content-Type; form fields when the headers say so; empty data: no body,
    # whatever the method.
    as_json = api_flow(tmp_path, api.base + "/echo", inputs=["word"], http_method="PUT",
                       data='{"w": "{{word}}", "n": [1, 2]}', outputs=["body", "kind"])
    assert _out(run_doc(as_json, inputs={"word": "hi"}), "body", "kind") == {"body": '{"w":"hi","n":[1,2]}',
                                                                         "kind": "application/json"}
    raw = api_flow(tmp_path, api.base + "/echo", inputs=["word"], http_method="PUT", data="say {{word}}",
                   outputs=["body", prop("kind", default="none")])
    assert _out(run_doc(raw, inputs={"word": "hi"}), "body", "kind") == {"body": "say hi", "kind": "none"}
    form = api_flow(tmp_path, api.base + "/echo", inputs=["word"], http_method="POST",
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                    data={"w": "{{word}}", "n": 1, "yes": True}, outputs=["body"])
    assert run_doc(form, inputs={"word": "a b"})["body"] == "w=a+b&n=1&yes=true"
    empty = api_flow(tmp_path, api.base + "/echo", http_method="POST", outputs=["body"])
    assert run_doc(empty) == {"body": ""} and "content-type" not in api.requests[-1]["headers"]


def test_outputs_are_read_as_wayflow_reads_them(tmp_path, api):
    # No outputs declared: one, `response`, the answer's key "response" (the jq query `.response`).
    assert run_doc(api_flow(tmp_path, api.base + "/echo")) == {"response": "the response key"}
    # http_response declared a string: the answer's text. A key the answer lacks, or holds as null,
    # gives no value (WayFlow drops a null output): the output's default, else the run fails.
    text = api_flow(tmp_path, api.base + "/echo", outputs=[prop("absent", default="d"), prop("nothing", default=1),
                                                          "http_response"])
    state = run_doc(text)
    assert state["absent"] == "d" and state["nothing"] == 1 and json.loads(state["http_response"])["path"] == "/echo"
    code, line = refusal(api_flow(tmp_path, api.base + "/echo", outputs=["absent"]))
    assert code == 1 and "ApiNode 'call' gave no value for its output 'absent'" in line
    # Declared outputs are read from JSON: a text answer, or a JSON list, fails the node.
    code, line = refusal(api_flow(tmp_path, api.base + "/text", outputs=["words"]))
    assert code == 1 and "ApiNode 'call'" in line and "'plain words', which is not JSON" in line
    code, line = refusal(api_flow(tmp_path, api.base + "/list", outputs=["x"]))
    assert code == 1 and "a JSON list, not an object" in line
    # A value its declaration does not admit fails the node, naming both.
    code, line = refusal(api_flow(tmp_path, api.base + "/echo", outputs=[prop("method", "integer")]))
    assert code == 1 and "output 'method' is declared integer, and the answer gives 'GET'" in line
    # `outputs: []` reads nothing: any answer will do.
    assert run_doc(api_flow(tmp_path, api.base + "/text", outputs=[])) == {}


def test_an_answer_other_than_2xx_is_asked_three_times(tmp_path, api):
    # WayFlow's ApiCallStep without a retry_policy asks again, at once, up to 3 requests in all.
    api.failures["/echo"] = 2
    flow = api_flow(tmp_path, api.base + "/echo", http_method="POST", data={"n": 1}, outputs=["method"])
    assert run_doc(flow) == {"method": "POST"} and api.paths() == ["/echo"] * 3
    api.requests.clear()
    code, line = refusal(api_flow(tmp_path, api.base + "/missing", outputs=["x"]))
    assert code == 1 and api.paths() == ["/missing"] * 3
    assert "answered HTTP 404 Not Found (3 times" in line and "no such city" in line


def test_the_answer_is_read_within_the_cap(tmp_path, api):
    code, line = refusal(api_flow(tmp_path, api.base + "/echo", outputs=["x"]),
                         settings=RunSettings(max_response_bytes=10))
    assert code == 1 and "over 10 bytes once decoded" in line and "--max-response-bytes" in line


@pytest.mark.parametrize(("fields", "expected"), [
    ({"url": "http://{{x}}/a"}, "a placeholder may fill its path and query, not its host"),
    ({"sensitive_headers": {"Authorization": "Bearer literal"}}, "sensitive_headers 'Authorization' must be a $VAR"),
    ({"retry_policy": {"max_attempts": 1}}, "retry_policy is not supported by heddle yet"),
    ({"outputs": [prop("a-b")]}, "output 'a-b' is read from the answer as the jq query '.a-b'"),
    ({"url_allow_list": ["https://elsewhere.example/"]}, "none of its url_allow_list entries allows"),
])
def test_what_cannot_be_sent_as_written_is_refused_naming_it(tmp_path, fields, expected):
    from heddle.agentspec import load_flow

    node = {"url": fields.pop("url", "http://example.test/{{x}}"), **fields}
    outputs = node.pop("outputs", [prop("y")])
    flow = api_flow(tmp_path, node.pop("url"), inputs=["x"], outputs=outputs, **node)
    with pytest.raises(DocumentError) as caught:
        load_flow(flow)
    assert "ApiNode 'call'" in str(caught.value) and expected in str(caught.value)


def test_heddle_s_own_secret_is_refused(tmp_path, capsys):
    flow = api_flow(tmp_path, "http://example.test/x", outputs=[prop("y")],
                    headers={"X-Key": "$HEDDLE_KEY_PASSPHRASE"})
    proc = heddle_here(capsys, "validate", flow)
    assert proc.returncode == 2
    assert "ApiNode 'call' at $.nodes[1]: headers 'X-Key' reads $HEDDLE_KEY_PASSPHRASE" in error_line(proc)


def test_a_session_resumes_without_sending_it_again(tmp_path, api, capsys):
    f = FlowDoc("api-wait")
    s = f.start([])
    a = f._node("ApiNode", "call", [], [prop("method")], url=api.base + "/echo", http_method="POST",
                data={"n": 1})
    ask = f._node("InputMessageNode", "ask", [], ["reply"], message="your reply?")
    e = f.end(["method", "reply"])
    for x, y in ((s, a), (a, ask), (ask, e)):
        f.control(x, y)
    flow = f.write(tmp_path / "flow.json")
    db = tmp_path / "s.db"
    first = heddle_here(capsys, "run", flow, "--session", "s1", "--session-db", db, "--no-input")
    assert first.returncode == 10, first.stderr
    second = heddle_here(capsys, "run", flow, "--session", "s1", "--session-db", db, "--message", "hi")
    assert state_of(second) == {"method": "POST", "reply": "hi"}
    assert api.paths() == ["/echo"]  # sent once, before the wait; not again on resuming
    # In a session the request is a step: it carries its idempotency key.
    assert api.requests[0]["headers"]["idempotency-key"].startswith("hk-")


def test_a_durable_runs_request_whose_answer_was_lost_is_sent_again_with_its_key(tmp_path, api):
    import asyncio

    from heddle.errors import StoreUnavailable
    from heddle.runs import execute, from_document
    from heddle.sessions.turn import SessionUse
    from tests.support.memstore import MemStore

    class LosesTheAnswer(MemStore):
        """Fails to append the ApiNode's result once: as if the process died after the request was sent."""

        lost = False

        async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
            if b'"type":"tool_done"' in data and b'"call":"api"' in data and not self.lost:
                self.lost = True
                raise StoreUnavailable("memory: the process died here")
            await super().append_step(session_id, base, seq, data)

    flow = api_flow(tmp_path, api.base + "/echo", outputs=["method"], http_method="POST", data={"n": 1})
    store = LosesTheAnswer()

    def turn(resume: bool) -> Any:
        loaded = from_document(flow, RunSettings(), tools_dir=None)
        return asyncio.run(execute(loaded, session=SessionUse(store, "s", resume=resume, durable=not resume)))

    with pytest.raises(StoreUnavailable):
        turn(False)
    assert turn(True).outputs == {"method": "POST"}
    # The request whose answer was lost is the only one sent again, with the key it had (its intent was kept).
    keys = [r["headers"]["idempotency-key"] for r in api.requests]
    assert api.paths() == ["/echo", "/echo"] and keys[0] == keys[1] and keys[0].startswith("hk-")
    from heddle.sessions.record import decode

    assert decode("s", store.sessions["s"].data, store="memory").status == "idle" and store.steps_kept == {}


def test_deny_net_refuses_it(tmp_path, api):
    code, line = refusal(api_flow(tmp_path, api.base + "/echo", outputs=["method"]),
                         settings=RunSettings(safe=True, deny_net=True))
    assert code == 2 and "ApiNode 'call'" in line and "--deny-net" in line
    assert api.paths() == []


def test_a_flow_sent_to_the_server_meets_the_model_url_guard(tmp_path):
    # heddle-server holds an ApiNode of a flow sent in a request to a RemoteTool's rules: no private
    # address unless --allow-net names it, no header read from the server's environment.
    import asyncio

    from heddle.server.errors import ApiError
    from heddle.server.model_policy import ModelPolicy
    from heddle.agentspec import load_flow

    def check(policy: ModelPolicy, url: str, **fields: Any) -> None:
        flow = load_flow(api_flow(tmp_path, url, outputs=["x"], **fields))
        asyncio.run(policy.check(policy.plan(flow)))

    for url in ("http://127.0.0.1:9/a", "http://169.254.169.254/latest", "http://10.0.0.1/"):
        with pytest.raises(ApiError) as err:
            check(ModelPolicy(), url)
        assert err.value.status == 400 and err.value.type == "forbidden_url"
        assert "ApiNode 'call' at $.nodes[1]" in err.value.message
    check(ModelPolicy(allow_net=("127.0.0.1",)), "http://127.0.0.1:9/a")
    with pytest.raises(ApiError) as err:
        check(ModelPolicy(allow_net=("127.0.0.1",)), "http://127.0.0.1:9/a", headers={"X-Key": "$HOME"})
    assert err.value.status == 400 and err.value.type == "forbidden_key"


def test_doctor_lists_the_variables_its_headers_read(tmp_path):
    from heddle.bundle.flowenv import env_reads

    flow = api_flow(tmp_path, "https://example.com/a", outputs=["x"], sensitive_headers={"Authorization": "$API_TOKEN"})
    reads = env_reads(json.loads(flow.read_text()))
    assert [(r.name, r.where) for r in reads] == [
        ("API_TOKEN", "sensitive_headers 'Authorization' of ApiNode 'call' at $.nodes[1]")]
