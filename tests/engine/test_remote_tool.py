"""RemoteTool against a real HTTP server on 127.0.0.1 (port 0): the request made from the
arguments, secrets from $VAR, redirects, the timeout, the size cap, the outputs, and the
server's guard for flows sent in requests.

The reference is WayFlow 26.3.1, whose RemoteTool runs its ApiCallStep (as ApiNode does): each
test states what it does. The same requests were checked byte for byte against WayFlow itself,
both sending to one local server."""

from __future__ import annotations

import asyncio
import functools
import json
import zlib
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
from tests.support.cli import state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, prop
from tests.support.inproc import URL, check_doc, refusal, run_doc, served_model


@functools.cache
def _bombs() -> dict[str, bytes]:
    from tests.support.bombs import zstd_bomb

    return {"gzip": zlib.compress(bytes(64 << 20), 1, wbits=31), "zstd": zstd_bomb(1 << 30)}


@dataclass
class Stub:
    """An HTTP API that records every request and answers by path."""

    base: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    failures: dict[str, int] = field(default_factory=dict)  # path -> 503 answers still to give

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]


def _handler(stub: Stub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length).decode("utf-8") if length else ""
            seen = {"method": self.command, "path": parts.path, "query": parse_qs(parts.query),
                    "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            stub.requests.append(seen)
            path = parts.path
            if stub.failures.get(path, 0) > 0:
                stub.failures[path] -= 1
                self._send(503, "text/plain", "busy, try again")
            elif path.startswith("/echo"):
                self._send(200, "application/json", json.dumps({
                    "method": self.command, "path": self.path, "body": body,
                    "auth": self.headers.get("authorization"), "trace": self.headers.get("x-trace")}))
            elif path == "/text":
                self._send(200, "text/plain; charset=utf-8", "plain words")
            elif path == "/true":
                self._send(200, "application/json", "true")
            elif path == "/same-host":
                self._redirect("/echo/after")
            elif path == "/other-host":
                self._redirect(stub.base.replace("127.0.0.1", "localhost") + "/echo/elsewhere")
            elif path == "/loop":
                self._redirect("/loop")
            elif path == "/missing":
                self._send(404, "application/json", '{"error": "no such city"}')
            elif path == "/big":
                # No Content-Length: the cap must hold while the body streams.
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.end_headers()
                self.wfile.write(b"x" * 5000)
                self.close_connection = True
            elif path in ("/bomb-gzip", "/bomb-zstd"):
                # A few KiB that decode to 1 GiB: the cap must count decoded bytes as they are decoded.
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.send_header("content-encoding", path.rsplit("-", 1)[1])
                data = _bombs()[path.rsplit("-", 1)[1]]
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass  # heddle hung up at its cap
            elif path == "/to-data":
                self._redirect("data:text/plain,hello")
            elif path == "/br":
                self.send_response(200)
                self.send_header("content-encoding", "br")
                self.send_header("content-length", "3")
                self.end_headers()
                self.wfile.write(b"abc")
            elif path == "/hang":
                stub.release.wait(10)
                try:
                    self._send(200, "text/plain", "late")
                except OSError:
                    pass  # heddle gave up on it at its deadline and hung up, as it should
            else:
                self._send(500, "text/plain", "unexpected path")

        def _send(self, status: int, kind: str, text: str) -> None:
            data = text.encode("utf-8")
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _redirect(self, location: str) -> None:
            self.send_response(302)
            self.send_header("location", location)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = do_DELETE = _answer

    return Handler


@pytest.fixture(scope="module")
def api() -> Iterator[Stub]:
    stub = Stub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    server.daemon_threads = True
    stub.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield stub
    stub.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def stub(api: Stub) -> Stub:
    api.requests.clear()
    api.failures.clear()
    return api


def remote_tool(name: str, url: str, *, method: str = "GET", inputs=(), outputs=(), **fields: Any) -> dict[str, Any]:
    return {"component_type": "RemoteTool", "id": f"remote-{name}", "name": name, "description": f"the {name} API",
            "url": url, "http_method": method, "inputs": [prop(i) if isinstance(i, str) else i for i in inputs],
            "outputs": [prop(o) if isinstance(o, str) else o for o in outputs], **fields}


def tool_flow(tmp_path: Path, tool: dict[str, Any], inputs=()) -> Path:
    f = FlowDoc("remote", version="26.3.1")  # url_allow_list: 26.1.2
    s = f.start(list(inputs) or tool["inputs"])
    t = f.tool_node("call", tool)
    e = f.end(tool["outputs"])
    f.control(s, t)
    f.control(t, e)
    return f.write(tmp_path / "flow.json")


def test_the_request_is_made_from_the_arguments(tmp_path, stub, monkeypatch):
    # WayFlow: the arguments reach its ApiCallStep as strings (a boolean as JSON writes it, `true`); a
    # url value is quote_plus'd (a space is "+", "/" is %2F), so it fills one segment; a dict body is
    # compact JSON with Content-Type application/json; sensitive_headers are sent.
    monkeypatch.setenv("REMOTE_TOKEN", "Bearer s3cret")
    tool = remote_tool(
        "order", stub.base + "/echo/{{city}}", method="post", inputs=["city", "units", prop("flag", "boolean")],
        outputs=["echo"], query_params={"units": "{{units}}", "fixed": 1, "many": ["a", "{{units}}"], "f": "{{flag}}"},
        headers={"X-Trace": "t-{{units}}-{{flag}}"}, sensitive_headers={"Authorization": "$REMOTE_TOKEN"},
        data={"city": "{{city}}", "count": 2, "tags": ["{{units}}"]})
    # An argument that looks like $VAR stays text.
    state = run_doc(tool_flow(tmp_path, tool), inputs={"city": "São Paulo/1", "units": "$REMOTE_TOKEN", "flag": True})
    seen = stub.requests[0]
    assert seen["method"] == "POST" and seen["path"] == "/echo/S%C3%A3o+Paulo%2F1"
    assert seen["query"] == {"units": ["$REMOTE_TOKEN"], "fixed": ["1"], "many": ["a", "$REMOTE_TOKEN"], "f": ["true"]}
    assert seen["body"] == '{"city":"São Paulo/1","count":2,"tags":["$REMOTE_TOKEN"]}'
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["headers"]["authorization"] == "Bearer s3cret" and seen["headers"]["x-trace"] == "t-$REMOTE_TOKEN-true"
    # The tool's one output is the answer's text, whole.
    echo = json.loads(state["echo"])
    assert echo["method"] == "POST" and echo["auth"] == "Bearer s3cret" and echo["trace"] == "t-$REMOTE_TOKEN-true"


def test_bodies_forms_and_outputs(tmp_path, stub):
    # WayFlow: a string body that is not JSON goes as written, without a Content-Type; form fields
    # when the headers say so; empty data (the default {}) sends no body.
    text = remote_tool("raw", stub.base + "/echo", method="PUT", inputs=["word"], outputs=["echo"],
                       data="say {{word}}")
    assert json.loads(run_doc(tool_flow(tmp_path, text), inputs={"word": "hi"})["echo"])["body"] == "say hi"
    assert "content-type" not in stub.requests[-1]["headers"]
    form = remote_tool("form", stub.base + "/echo", method="POST", inputs=["word"], outputs=["echo"],
                       headers={"Content-Type": "application/x-www-form-urlencoded"}, data={"w": "{{word}}", "n": 1})
    assert json.loads(run_doc(tool_flow(tmp_path, form), inputs={"word": "a b"})["echo"])["body"] == "w=a+b&n=1"
    get = remote_tool("get", stub.base + "/echo", method="POST", outputs=["echo"])
    assert json.loads(run_doc(tool_flow(tmp_path, get))["echo"])["body"] == ""
    assert "content-type" not in stub.requests[-1]["headers"]
    # WayFlow's RemoteTool gives the answer's text (its step's http_response) as its one output,
    # JSON or not; with no output declared, that output is `http_response`.
    flag = remote_tool("flag", stub.base + "/true", outputs=["ok"])
    assert run_doc(tool_flow(tmp_path, flag)) == {"ok": "true"}
    words = remote_tool("words", stub.base + "/text", outputs=["words"])
    assert run_doc(tool_flow(tmp_path, words)) == {"words": "plain words"}
    nothing = remote_tool("nothing", stub.base + "/text")
    assert run_doc(tool_flow(tmp_path, nothing))["http_response"] == "plain words"
    # An output that does not admit that text fails the call, naming both (WayFlow passes the text
    # on under a type it is not); several outputs fail it (WayFlow's ToolNode: "The tool has several
    # outputs, it should return a dictionary").
    whole = remote_tool("whole", stub.base + "/echo/x", outputs=[prop("echo", "object")])
    code, line = refusal(tool_flow(tmp_path, whole))
    assert code == 1 and "output 'echo' is declared object, and its answer is text" in line
    several = remote_tool("several", stub.base + "/echo/x", outputs=["method", "path"])
    code, line = refusal(tool_flow(tmp_path, several))
    assert code == 1 and "declares 2 outputs (method, path)" in line and "declare one output" in line


def test_an_answer_other_than_2xx_is_asked_three_times(tmp_path, stub):
    # WayFlow's ApiCallStep without a retry_policy asks again at once, up to 3 requests in all; the
    # last answer other than 2xx fails the call.
    stub.failures["/echo"] = 2
    tool = remote_tool("busy", stub.base + "/echo", method="POST", data={"n": 1}, outputs=["echo"])
    assert json.loads(run_doc(tool_flow(tmp_path, tool))["echo"])["method"] == "POST"
    assert stub.paths() == ["/echo"] * 3
    stub.requests.clear()
    missing = remote_tool("missing", stub.base + "/missing", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, missing))
    assert code == 1 and stub.paths() == ["/missing"] * 3
    assert "answered HTTP 404 Not Found (3 times" in line and "no such city" in line


def test_redirects_stay_on_the_host(tmp_path, stub):
    same = remote_tool("same", stub.base + "/same-host", outputs=["echo"])
    assert json.loads(run_doc(tool_flow(tmp_path, same))["echo"])["path"] == "/echo/after"
    other = remote_tool("other", stub.base + "/other-host", outputs=["echo"])
    code, line = refusal(tool_flow(tmp_path, other))
    assert code == 1 and "another host than 127.0.0.1" in line and "localhost" in line
    assert "/echo/elsewhere" not in stub.paths()
    loop = remote_tool("loop", stub.base + "/loop", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, loop))
    assert "redirected more than 5 times" in line and stub.paths().count("/loop") == 6


def test_failures_are_tool_errors(tmp_path, stub):
    big = remote_tool("big", stub.base + "/big", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, big), settings=RunSettings(max_response_bytes=1000))
    assert "over 1000 bytes once decoded" in line and "--max-response-bytes" in line
    hang = remote_tool("hang", stub.base + "/hang", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, hang), settings=RunSettings(tool_timeout=0.2))
    assert code == 1 and "timed out after 0.2 s" in line and "--tool-timeout" in line
    stub.release.set()


def test_an_agent_calls_it(tmp_path, stub):
    # WayFlow: the model gets the answer's text.
    tool = remote_tool("weather", stub.base + "/echo/{{city}}", inputs=["city"])
    f = FlowDoc("remote-agent")
    s = f.start(["query"])
    a = f.agent("agent", llm_config(URL), tools=[tool])
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    script = [{"tool_calls": [{"name": "weather", "arguments": {"city": "Zurich"}}]}, {"content": "done"}]
    with served_model(script) as model:
        state = run_doc(f.write(tmp_path / "flow.json"), inputs={"query": "q"}, transport=model.transport)
        sent = model.requests()
    assert state["result"] == "done" and stub.paths() == ["/echo/Zurich"]
    tools = sent[0]["body"]["tools"]
    assert tools[0]["function"]["name"] == "weather"
    assert tools[0]["function"]["parameters"]["required"] == ["city"]
    assert "/echo/Zurich" in json.dumps(sent[1]["body"]["messages"][-1])


def _load(tmp_path: Path, tool: dict[str, Any]) -> Any:
    from heddle.agentspec import load_flow

    return load_flow(tool_flow(tmp_path, tool, inputs=["x"]))


@pytest.mark.parametrize(("fields", "expected"), [
    ({"url": "http://{{x}}/a"}, "a placeholder may fill its path and query, not its host"),
    ({"url": "http://user:pw@example.com/a"}, "credentials go in sensitive_headers"),
    ({"url": "ftp://example.com/a"}, "must be an http:// or https:// URL"),
    ({"url": "http://example.com/{{y}}"}, "url has the placeholder {{y}}, which is none of its inputs (x)"),
    ({"headers": {"X-Key": "literal"}, "sensitive_headers": {"X-Key": "$K"}}, "in both headers and sensitive_headers"),
    ({"sensitive_headers": {"Authorization": "Bearer abc"}}, "must be a $VAR reference"),
    ({"headers": {"A": "$not valid"}}, "is not a valid environment variable reference"),
    ({"http_method": "GE T"}, "is not an HTTP method"),
    ({"retry_policy": {"max_attempts": 3}}, "retry_policy is not supported"),
    ({"url_allow_list": ["https://other.example.com/"]}, "none of its url_allow_list entries allows"),
])
def test_a_request_heddle_cannot_send_is_refused_when_read(tmp_path, fields, expected):
    tool = {**remote_tool("api", "https://example.com/items/{{x}}", inputs=["x"]), **fields}
    with pytest.raises(DocumentError) as err:
        _load(tmp_path, tool)
    assert expected in str(err.value) and "RemoteTool 'api'" in str(err.value)
    assert "$.nodes[1].tool" in str(err.value) or "$referenced_components" in str(err.value)


def test_inputs_are_inferred_and_the_allow_list_holds(tmp_path, stub, monkeypatch):
    from heddle.agentspec.components import RemoteTool

    tool = remote_tool("api", stub.base + "/echo/{{a}}", query_params={"b": "{{b}}"}, outputs=["e"])
    del tool["inputs"]
    assert RemoteTool.model_validate(tool).inputs == [prop("a"), prop("b")]
    allowed = remote_tool("allowed", stub.base + "/{{where}}", inputs=["where"], outputs=["e"],
                          url_allow_list=[stub.base + "/echo"])
    assert json.loads(run_doc(tool_flow(tmp_path, allowed), inputs={"where": "echo"})["e"])["path"] == "/echo"
    code, line = refusal(tool_flow(tmp_path, allowed), inputs={"where": "text"})
    assert "is not allowed by its url_allow_list" in line and "/text" not in stub.paths()
    # A header read from the environment must be set before anything runs.
    monkeypatch.delenv("ABSENT_TOKEN", raising=False)
    secret = remote_tool("secret", stub.base + "/echo", outputs=["x"], sensitive_headers={"X-Key": "$ABSENT_TOKEN"})
    before = len(stub.requests)
    code, line = refusal(tool_flow(tmp_path, secret))
    assert code == 2 and "ABSENT_TOKEN, which is not set" in line and len(stub.requests) == before
    # heddle's own secrets go to no tool, a RemoteTool's host included; --deny-net leaves it no network.
    monkeypatch.setenv("HEDDLE_AUTH_TOKEN", "server-token")
    own = remote_tool("own", stub.base + "/echo", outputs=["x"], headers={"X-Key": "$HEDDLE_AUTH_TOKEN"})
    code, line = refusal(tool_flow(tmp_path, own))
    assert code == 2 and "HEDDLE_AUTH_TOKEN, heddle's own secret" in line
    plain = remote_tool("plain", stub.base + "/echo", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, plain), settings=RunSettings(safe=True, deny_net=True))
    assert code == 2 and "--deny-net gives tools no network" in line and len(stub.requests) == before


def test_the_cli_runs_it_and_validate_needs_no_executable(tmp_path, stub, capsys):
    tool = remote_tool("weather", stub.base + "/echo/{{city}}", inputs=["city"], outputs=["echo"])
    flow = tool_flow(tmp_path, tool)
    assert check_doc(flow) == (0, "")  # no executable is looked for: the document holds the tool
    # The command's entry function in this process: the request is made by the run, not the process.
    state = state_of(heddle_here(capsys, "run", flow, "--input", '{"city": "Bern"}'))
    assert json.loads(state["echo"])["path"] == "/echo/Bern"


def test_request_flows_meet_the_model_url_guard(tmp_path):
    from heddle.server.errors import ApiError
    from heddle.server.model_policy import ModelPolicy
    from heddle.agentspec import load_flow

    def check(policy: ModelPolicy, url: str, **fields: Any) -> None:
        flow = load_flow(tool_flow(tmp_path, remote_tool("api", url, outputs=["x"], **fields)))
        asyncio.run(policy.check(policy.plan(flow)))

    for url in ("http://127.0.0.1:9/a", "http://localhost:9/a", "http://169.254.169.254/latest", "http://10.0.0.1/"):
        with pytest.raises(ApiError) as err:
            check(ModelPolicy(), url)
        assert err.value.status == 400 and err.value.type == "forbidden_url" and "--allow-net" in err.value.message
        assert "RemoteTool 'api' at $.nodes[1].tool" in err.value.message
    check(ModelPolicy(allow_net=("127.0.0.1",)), "http://127.0.0.1:9/a")
    with pytest.raises(ApiError) as err:
        check(ModelPolicy(allow_net=("127.0.0.1",)), "http://127.0.0.1:9/a", headers={"X-Key": "$HOME"})
    assert err.value.status == 400 and err.value.type == "forbidden_key"
    # A RemoteTool may not borrow the exemption of the server's default model endpoint.
    with pytest.raises(ApiError):
        check(ModelPolicy(default_url="http://127.0.0.1:9/v1"), "http://127.0.0.1:9/v1")


def test_doctor_lists_the_variables_its_headers_read(tmp_path):
    from heddle.bundle.flowenv import env_reads

    tool = remote_tool("api", "https://example.com/a", outputs=["x"], headers={"X-Trace": "$TRACE_ID"},
                       sensitive_headers={"Authorization": "${API_TOKEN}"})
    reads = env_reads(json.loads(tool_flow(tmp_path, tool).read_text()))
    assert [(r.name, r.where) for r in reads] == [
        ("TRACE_ID", "headers 'X-Trace' of RemoteTool 'api' at $.nodes[1].tool"),
        ("API_TOKEN", "sensitive_headers 'Authorization' of RemoteTool 'api' at $.nodes[1].tool")]


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_a_compressed_answer_is_capped_as_it_decodes(tmp_path, stub, coding):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    bomb = remote_tool("bomb", stub.base + f"/bomb-{coding}", outputs=["x"])
    code, line = refusal(tool_flow(tmp_path, bomb))
    assert code == 1 and "over 16 MiB once decoded" in line and "--max-response-bytes" in line
    assert "\n" not in line
    # The peak of this process grew by far less than the gigabyte the answer decodes to.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024


def test_an_encoding_heddle_cannot_bound_is_refused(tmp_path, stub):
    code, line = refusal(tool_flow(tmp_path, remote_tool("br", stub.base + "/br", outputs=["x"])))
    assert code == 1 and "br-encoded, which heddle does not decode" in line


@pytest.mark.parametrize("headers", [{"Content-Type": "application/json"}, {}])
def test_an_argument_may_not_change_the_shape_of_a_json_body(tmp_path, stub, headers):
    # WayFlow fills a string body as text and sends it as JSON when it then parses as JSON: an
    # argument that closes the string it fills would send a field of its own. heddle sends the same
    # body as WayFlow for every other value, and refuses the call for that one.
    tool = remote_tool("order", stub.base + "/echo", method="POST", inputs=["item"], outputs=["echo"],
                       headers=headers, data='{"admin": false, "item": "{{item}}"}')
    state = run_doc(tool_flow(tmp_path, tool), inputs={"item": "a book"})
    assert json.loads(json.loads(state["echo"])["body"]) == {"admin": False, "item": "a book"}
    before = len(stub.requests)
    code, line = refusal(tool_flow(tmp_path, tool), inputs={"item": 'x", "admin": true, "z": "'})
    assert code == 1 and "would change the shape of its JSON body" in line and len(stub.requests) == before


def test_a_json_body_value_outside_a_string_must_be_one_value(tmp_path, stub):
    count = prop("count", "integer")
    tool = remote_tool("order", stub.base + "/echo", method="POST", inputs=[count, "item"], outputs=["echo"],
                       data='{"count": {{count}}, "item": "{{item}}"}')
    state = run_doc(tool_flow(tmp_path, tool), inputs={"count": 3, "item": "a"})
    assert json.loads(json.loads(state["echo"])["body"]) == {"count": 3, "item": "a"}
    loose = remote_tool("order", stub.base + "/echo", method="POST", inputs=["count"], outputs=["echo"],
                        data='{"count": {{count}}, "admin": false}')
    code, line = refusal(tool_flow(tmp_path, loose), inputs={"count": '1, "admin": true'})
    assert code == 1 and "is not one JSON value" in line


def test_a_redirect_to_data_is_one_line(tmp_path, stub):
    code, line = refusal(tool_flow(tmp_path, remote_tool("data", stub.base + "/to-data", outputs=["x"])))
    assert code == 1 and "redirected to a Location that is not a URL" in line and "\n" not in line


def test_an_agents_model_gets_the_overrun_as_the_tool_result(tmp_path, stub):
    tool = remote_tool("bomb", stub.base + "/bomb-zstd", outputs=["x"])
    f = FlowDoc("remote-agent")
    s = f.start(["query"])
    a = f.agent("agent", llm_config(URL), tools=[tool])
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    script = [{"tool_calls": [{"name": "bomb", "arguments": {}}]}, {"content": "it failed"}]
    with served_model(script) as model:
        state = run_doc(f.write(tmp_path / "flow.json"), inputs={"query": "q"}, transport=model.transport)
        sent = model.requests()
    assert state["result"] == "it failed"
    result = json.dumps(sent[1]["body"]["messages"][-1])
    assert "over 16 MiB once decoded" in result and "--max-response-bytes" in result
