"""heddle's own secrets stay heddle's: a document that reads one (`api_key: $HEDDLE_AUTH_TOKEN`, a
header, an MCP server's header) is refused when it is read, by `validate`, `run`, `bundle` and
`heddle-server` alike, naming the field and the variable; the host it names never hears of it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from heddle import graph, seal, secret_env
from tests.server.support import run_server_to_exit
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc, llm_config
from tests.support.server_thread import threaded_server
from tests.support.threaded_model import threaded_model

TOKEN = "the-servers-own-token"


def llm_flow(path: Path, config: dict[str, Any]) -> Path:
    f = FlowDoc("asks")
    start = f.start(["q"])
    node = f.llm("ask", config, "{{q}}", ["q"])
    end = f.end(["generated_text"])
    f.control(start, node)
    f.control(node, end)
    return f.write(path)


def with_tool(path: Path, tool: dict[str, Any]) -> Path:
    f = FlowDoc("calls")
    start = f.start([])
    node = f.tool_node("call", tool, inputs=[], outputs=["x"])
    end = f.end(["x"])
    f.control(start, node)
    f.control(node, end)
    return f.write(path)


def remote(**fields: Any) -> dict[str, Any]:
    return {"component_type": "RemoteTool", "id": "remote-1", "name": "remote", "url": "https://api.example/x",
            "http_method": "GET", "inputs": [], "outputs": [{"title": "x", "type": "string"}], **fields}


def mcp(**fields: Any) -> dict[str, Any]:
    transport = {"component_type": "StreamableHTTPTransport", "id": "t-1", "name": "srv",
                 "url": "https://mcp.example/mcp", **fields}
    return {"component_type": "MCPTool", "id": "mcp-1", "name": "lookup", "inputs": [],
            "outputs": [{"title": "x", "type": "string"}], "client_transport": transport}


def test_every_field_that_reads_the_environment_is_refused_a_secret(tmp_path: Path, capsys: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in secret_env.SECRET_ENV:
        monkeypatch.setenv(name, "secret")
    cases = [
        (llm_flow(tmp_path / "key.json", llm_config("http://127.0.0.1:9/v1", api_key="${HEDDLE_SESSION_STORE}")),
         "llm_config 'scripted' at $.nodes[1].llm_config: api_key reads $HEDDLE_SESSION_STORE"),
        (llm_flow(tmp_path / "url.json", llm_config("$HEDDLE_REGISTRY_PASSWORD")),
         "llm_config 'scripted' at $.nodes[1].llm_config: url reads $HEDDLE_REGISTRY_PASSWORD"),
        (with_tool(tmp_path / "remote.json", remote(headers={"X-Key": "$HEDDLE_KEY_PASSPHRASE"})),
         "RemoteTool 'remote' at $.nodes[1].tool: headers 'X-Key' reads $HEDDLE_KEY_PASSPHRASE"),
        (with_tool(tmp_path / "mcp.json", mcp(sensitive_headers={"Authorization": "$HEDDLE_SESSION_KEY"})),
         ("StreamableHTTPTransport 'srv' at $.nodes[1].tool.client_transport: sensitive_headers 'Authorization' "
          "reads $HEDDLE_SESSION_KEY")),
    ]
    for flow, expected in cases:
        for command in ("validate", "run", "bundle"):
            args = ("-o", tmp_path / "out.heddle") if command == "bundle" else ()
            rc, _, err = heddle_inproc(capsys, command, flow, *args)
            assert rc == 2 and expected in err and "heddle's own secret" in err, (command, err)
            assert not (tmp_path / "out.heddle").exists()
    # A variable of the user's own is read as before, and `$NAME` anywhere else is text.
    monkeypatch.setenv("MY_KEY", "mine")
    own = llm_flow(tmp_path / "own.json", llm_config("http://127.0.0.1:9/v1", api_key="$MY_KEY"))
    assert heddle_inproc(capsys, "validate", own)[0] == 0
    text = llm_config("http://127.0.0.1:9/v1", api_key="$MY_KEY", name="$HEDDLE_AUTH_TOKEN")
    assert heddle_inproc(capsys, "validate", llm_flow(tmp_path / "text.json", text))[0] == 0


def test_heddle_run_never_sends_the_token(tmp_path: Path) -> None:
    with threaded_model([{"content": "hi"}], loop=True) as model:
        flow = llm_flow(tmp_path / "flow.json", llm_config(model.url, api_key="$HEDDLE_AUTH_TOKEN"))
        proc = heddle("run", flow, "--input", '{"q": "hi"}', env={"HEDDLE_AUTH_TOKEN": TOKEN})
        assert proc.returncode == 2, proc.stderr
        line = error_line(proc)
        assert "$.nodes[1].llm_config: api_key reads $HEDDLE_AUTH_TOKEN, heddle's own secret" in line
        assert TOKEN not in proc.stderr + proc.stdout
        assert model.requests() == []


def test_heddle_server_never_sends_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"HEDDLE_AUTH_TOKEN": TOKEN, "HEDDLE_CACHE_DIR": str(tmp_path / "cache")}
    with threaded_model([{"content": "hi"}], loop=True) as model:
        flow = llm_flow(tmp_path / "flow.json", llm_config(model.url, api_key="$HEDDLE_AUTH_TOKEN"))
        # A bundle sealed by a heddle that did not refuse it: the server refuses it before its port opens.
        with monkeypatch.context() as patched:
            patched.setattr(graph, "secret_reads", lambda root: [])
            bundle = seal(flow, output=tmp_path / "old.heddle").path
        proc = run_server_to_exit(tmp_path, "--bundle", bundle, "--allow-unsigned", env=env)
        assert proc.returncode == 2, proc.stderr
        assert re.search(r"api_key reads \$HEDDLE_AUTH_TOKEN, heddle's own secret", proc.stderr)
        # A document sent with a request: 400, naming the field and the variable.
        monkeypatch.setenv("HEDDLE_AUTH_TOKEN", TOKEN)
        document = llm_flow(tmp_path / "sent.json", llm_config(model.url, api_key="$HEDDLE_AUTH_TOKEN"))
        tool_doc = with_tool(tmp_path / "tool.json", remote(url=model.url + "/x",
                                                            sensitive_headers={"X-Key": "$HEDDLE_AUTH_TOKEN"}))
        with threaded_server(tmp_path, "--allow-net", "127.0.0.1") as server, server.client(TOKEN) as client:
            for sent, field in ((document, "api_key"), (tool_doc, "'X-Key'")):
                answer = client.post("/v1/runs", json={"flow": sent.read_text(), "inputs": {"q": "hi"}})
                assert answer.status_code == 400, answer.text
                assert "HEDDLE_AUTH_TOKEN" in answer.json()["error"]["message"] and field in answer.text
        assert model.requests() == []


# heddle's variables that are not secrets: where its files are, and what it tells a tool or plugin (the
# idempotency key is minted by heddle for one call and given to that call's tool: it guards nothing).
NOT_SECRETS = {"HEDDLE_CACHE_DIR", "HEDDLE_TRUST_DIR", "HEDDLE_REGISTRY", "HEDDLE_PLUGIN_DIR", "HEDDLE_PLUGIN_HOME",
               "HEDDLE_PLUGIN_NAME", "HEDDLE_STREAM", "HEDDLE_WORKSPACE", "HEDDLE_WORKSPACE_BIN",
               "HEDDLE_IDEMPOTENCY_KEY"}


def test_every_variable_heddle_names_is_a_secret_or_said_not_to_be() -> None:
    """A variable added to heddle is decided on here: a secret (heddle.secret_env) no tool gets and
    no document reads, or not."""
    package = Path(secret_env.__file__).parent
    named = {name for path in package.rglob("*.py")
             for name in re.findall(r"[\"'](HEDDLE_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8"))}
    undecided = named - secret_env.SECRET_ENV - NOT_SECRETS
    assert not undecided, f"add each to heddle.secret_env.SECRET_ENV, or to NOT_SECRETS here: {sorted(undecided)}"
    assert all(secret_env.is_secret(name) for name in secret_env.SECRET_ENV)
    assert not any(secret_env.is_secret(name) for name in NOT_SECRETS)
