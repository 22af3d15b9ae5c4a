"""Tools sent in requests (`--allow-request-code`) and what a request's own flow may not reach."""

from __future__ import annotations

import pytest

from tests.server.flows import ECHO, agent_flow, one_tool_flow, write_tools
from tests.server.support import start_server
from tests.support.flows import FlowDoc, server_tool
from tests.support.server_thread import threaded_server
from tests.support.threaded_model import threaded_model

SHOUT_PY = "import json, sys\nargs = json.load(sys.stdin)\nprint(json.dumps({'loud': args['text'].upper()}))\n"
COUNT_SH = "#!/bin/sh\nwc -c | tr -d ' ' | sed 's/.*/{\"bytes\": &}/'\n"


def shout_flow() -> dict:
    f = FlowDoc("shout")
    s = f.start(["text"])
    t = f.tool_node("shout", server_tool("shout", ["text"]))
    c = f.tool_node("count", server_tool("count", ["loud"]))
    e = f.end(["loud", "bytes"])
    f.control(s, t)
    f.control(t, c)
    f.control(c, e)
    return f.document()


@pytest.fixture(scope="module")
def coded(tmp_path_factory):
    root = tmp_path_factory.mktemp("code")
    work = root / "work"
    tools = write_tools(root / "tools", {"echo": ECHO})
    server = start_server(root, "--allow-request-code", "--work-dir", work, "--tools-dir", tools)
    with server.client() as client:
        yield client, work, server
    server.stop()


def test_request_tools_run_and_their_folder_is_removed(coded):
    client, work, _ = coded
    body = {"flow": shout_flow(), "inputs": {"text": "ça"},
            "tools": [{"name": "shout", "source": SHOUT_PY, "interpreter": "python3"},
                      {"name": "count", "source": COUNT_SH}]}
    response = client.post("/v1/runs", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["state"]["loud"] == "ÇA" and response.json()["state"]["bytes"] > 0
    assert list(work.iterdir()) == []
    response = client.post("/v1/runs?stream=true", json=body)
    assert "event: flow_complete" in response.text and list(work.iterdir()) == []
    # Server tools and request tools together; a request tool's own #! line gives way to `interpreter`.
    f = one_tool_flow("mixed", "echo")
    body = {"flow": f.document(), "inputs": {"x": 1},
            "tools": [{"name": "spare", "source": "#!/bin/false\necho '{}'\n", "interpreter": "sh"}]}
    assert client.post("/v1/runs", json=body).json()["state"] == {"x": 1}
    report = client.post("/v1/validate", json={"flow": shout_flow(), "tools": [
        {"name": "shout", "source": SHOUT_PY, "interpreter": "python3"},
        {"name": "count", "source": COUNT_SH}]}).json()
    assert report["valid"] is True and list(work.iterdir()) == []
    caps = client.get("/v1/capabilities").json()
    assert caps["allowRequestCode"] is True
    metrics = client.get("/metrics").text
    assert 'tool="(request)"' in metrics and 'tool="shout"' not in metrics


def test_request_tools_are_checked(coded):
    client, work, _ = coded
    flow = shout_flow()
    cases = [
        ([{"name": "a/b", "source": "x"}], "tools[0].name 'a/b'"),
        ([{"name": "x" * 65, "source": "x"}], "use 1 to 64 letters"),
        ([{"name": "", "source": "x"}], "tools[0].name ''"),
        ([{"name": "shout", "source": "x", "interpreter": "perl"}], "interpreter 'perl'"),
        ([{"name": "shout", "source": ""}], "tools[0].source (tool 'shout')"),
        ([{"name": "shout", "source": 5}], "tools[0].source"),
        ([{"name": "shout", "source": "a"}, {"name": "shout", "source": "b"}], "tools[1].name 'shout' is sent twice"),
        ([{"name": "shout", "source": "a", "env": {}}], "tools[0].env is unknown"),
        (["shout"], "tools[0] must be an object"),
        ({"name": "shout"}, "'tools' must be a list"),
        ([{"name": f"t{i}", "source": "x"} for i in range(33)], "at most 32"),
        ([{"name": "echo", "source": "x"}], "'echo' is already a tool of this server"),
    ]
    for tools, expected in cases:
        response = client.post("/v1/runs", json={"flow": flow, "inputs": {"text": "a"}, "tools": tools})
        assert response.status_code == 400, (tools, response.text)
        assert expected in response.json()["error"]["message"], (expected, response.text)
    response = client.post("/v1/runs", json={"flow": flow, "inputs": {"text": "a"},
                                             "tools": [{"name": "shout", "source": SHOUT_PY}]})
    assert response.status_code == 400 and "ServerTool 'count' has no executable" in response.json()["error"]["message"]
    response = client.post("/v1/runs", json={"flow": flow, "toolsDir": "/usr/bin"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "forbidden_field"
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1", "http://localhost:9/v1", "http://10.1.2.3/v1",
                                 "http://169.254.169.254/latest", "http://[::1]:9/v1", "http://0.0.0.0:9",
                                 "http://192.168.0.1/v1", "http://[::ffff:127.0.0.1]:9/v1"])
def test_request_flows_cannot_reach_the_servers_network(coded, url):
    client, _, _ = coded
    response = client.post("/v1/runs", json={"flow": agent_flow("a", url).document(), "inputs": {"query": "q"}})
    assert response.status_code == 400, response.text
    err = response.json()["error"]
    assert err["type"] == "forbidden_url" and "--allow-net" in err["message"]
    report = client.post("/v1/validate", json={"flow": agent_flow("a", url).document()}).json()
    assert report["valid"] is False and "--allow-net" in report["problems"][0]


def test_request_flows_cannot_read_the_servers_environment(coded):
    client, _, _ = coded
    flow = agent_flow("a", "https://api.example.com/v1", api_key="$HOME").document()
    response = client.post("/v1/runs", json={"flow": flow, "inputs": {"query": "q"}})
    assert response.status_code == 400 and response.json()["error"]["type"] == "forbidden_key"
    assert "'$HOME'" in response.json()["error"]["message"]


def test_allow_net_and_the_default_model(tmp_path):
    script = [{"content": "one"}, {"content": "two"}, {"content": "three"}]
    with threaded_model(script) as model:  # the server is the process under test, not the model
        server = start_server(tmp_path, "--allow-net", "127.0.0.1", "--allow-net", "LocalHost",
                              "--llm-default-url", model.url.replace("/v1", ""),
                              env={"HEDDLE_LLM_DEFAULT_KEY": "lent-key", "OPENAI_API_KEY": "server-secret",
                                   "HEDDLE_STREAM": "0"})
        try:
            with server.client() as client:
                flow = agent_flow("a", model.url, api_key="callers-own").document()
                response = client.post("/v1/runs", json={"flow": flow, "inputs": {"query": "q"}})
                assert response.status_code == 200, response.text
                assert response.json()["state"]["result"] == "one"
                # No key of its own at the default endpoint: the server lends HEDDLE_LLM_DEFAULT_KEY.
                flow = agent_flow("a", model.url).document()
                assert client.post("/v1/runs", json={"flow": flow, "inputs": {"query": "q"}}).status_code == 200
                # An OpenAiConfig from a request never picks up the server's OPENAI_API_KEY.
                localhost = model.url.replace("127.0.0.1", "localhost")
                flow = agent_flow("a", localhost, component_type="OpenAiConfig").document()
                response = client.post("/v1/runs", json={"flow": flow, "inputs": {"query": "q"}})
                assert response.status_code == 200, response.text
            requests = model.requests()
            auth = [r["headers"].get("authorization") for r in requests]
            assert auth == ["Bearer callers-own", "Bearer lent-key", None]
            assert not any(r["body"].get("stream") for r in requests)  # HEDDLE_STREAM=0
        finally:
            server.stop()


def test_request_code_under_the_sandbox_sees_only_its_workspace(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("hush")
    work = tmp_path / "work"
    peek = (f"import json, os, sys\njson.load(sys.stdin)\n"
            f"print(json.dumps({{'sees_secret': os.path.exists({str(secret)!r}), 'cwd': os.getcwd(),"
            f" 'home': os.environ.get('HOME')}}))\n")
    # Served from a thread by the command's own entry (the request code runs in bubblewrap all the
    # same); what it prints is this test's captured stderr.
    capsys.readouterr()
    with threaded_server(tmp_path, "--allow-request-code", "--safe", "--deny-net", "--work-dir", work) as server:
        with server.client() as client:
            f = one_tool_flow("peek", "peek", outputs=("sees_secret", "home"))
            body = {"flow": f.document(), "inputs": {"x": 1},
                    "tools": [{"name": "peek", "source": peek, "interpreter": "python3"}]}
            response = client.post("/v1/runs", json=body)
            assert response.status_code == 200, response.text
            state = response.json()["state"]
            assert state["sees_secret"] is False and state["home"] == "/tmp/home"
            assert state["cwd"].startswith(str(work.resolve()) + "/heddle-peek-")
            assert client.get("/v1/capabilities").json()["sandbox"] == {"safe": True, "backend": "auto",
                                                                      "denyNet": True}
        assert list(work.iterdir()) == []
    assert "warning" not in capsys.readouterr().err


def test_without_the_flag_request_code_is_refused_and_flagged_at_start(coded):
    # The module's server was started with --allow-request-code and without --safe.
    _, _, server = coded
    assert "warning: --allow-request-code without --safe" in server.stderr()
