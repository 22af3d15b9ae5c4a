"""A2AAgent with A2AConnectionConfig, against a real A2A 1.0 server (the a2a-sdk's own request handler)
started by the test (tests/support/a2a_server.py), through the CLI's entry function.

The reference behaviour (WayFlow 26.3.1, fed the same documents; its client speaks A2A 0.3, so its
exchange was read from its requests to this server's 0.3 compatibility): an A2AAgent at the top level
is a conversation with the remote agent; each user message goes to `agent_url` in the conversation's
context, the task is polled until it completes or asks for input, and the remote agent's last message
is the answer; a failed task ends the run. An AgentNode whose agent is an A2AAgent is refused when the
document is loaded ("Only `Agent`, `ManagerWorkers` and `Swarm` in `AgentExecutionStep` ..."), and the
A2AAgent's declared inputs and outputs are dropped there, so heddle refuses them by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heddle.secret_env import AUTH_TOKEN as SECRET
from tests.support.cli_inproc import heddle_inproc


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    from tests.support.a2a_server import served

    with served() as (base, received):
        yield base, received


def _doc(path: Path, url: str, **connection: Any) -> Path:
    path.write_text(json.dumps({
        "component_type": "A2AAgent", "id": "remote", "name": "remote", "agent_url": url,
        "connection_config": {"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc", "timeout": 30,
                              **connection},
        "session_parameters": {"timeout": 30, "poll_interval": 0.02, "max_retries": 2},
        "agentspec_version": "26.1.0"}))
    return path


def _sent(received: list[dict[str, Any]], since: int) -> list[dict[str, Any]]:
    """The messages sent (SendMessage) since the `since`-th request."""
    return [r["params"]["message"] for r in received[since:] if r["method"] == "SendMessage"]


def test_a_top_level_a2a_agent_answers_with_the_remote_agents_message(
        remote: tuple[str, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, received = remote
    monkeypatch.setenv("A2A_TOKEN", "t0ken")
    doc = _doc(tmp_path / "echo.json", f"{base}/echo/", headers={"X-Token": "$A2A_TOKEN", "X-Plain": "p"})
    since = len(received)
    rc, out, err = heddle_inproc(capsys, "run", doc, "--message", "hello there")
    assert (rc, json.loads(out)) == (0, {"result": "echo: hello there"}), err
    (message,) = _sent(received, since)
    assert message["role"] == "ROLE_USER" and message["parts"] == [{"text": "hello there"}]
    assert message["contextId"] and "taskId" not in message
    # The task was polled (GetTask) until it completed; every request carried the document's headers.
    assert [r["method"] for r in received[since:]][:2] == ["SendMessage", "GetTask"]
    assert all(r["headers"].get("x-token") == "t0ken" and r["headers"].get("x-plain") == "p"
               for r in received[since:])


def test_input_required_is_a_session_wait_and_the_answer_continues_the_same_task(
        remote: tuple[str, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, received = remote
    doc, db = _doc(tmp_path / "ask.json", f"{base}/ask/"), tmp_path / "s.db"
    since = len(received)
    rc, out, err = heddle_inproc(capsys, "run", doc, "--message", "the weather?", "--session", "w", "--session-db", db)
    shown = json.loads(out)
    assert rc == 10, err
    assert shown["status"] == "waiting"
    assert shown["waiting_for"] == {"kind": "message", "node": "remote", "prompt": "Which city?"}
    (first,) = _sent(received, since)
    asked = len(received)
    rc, out, err = heddle_inproc(capsys, "run", doc, "--session", "w", "--session-db", db, "--message", "Paris")
    assert rc == 0, err
    assert json.loads(out) == {"result": f"weather in Paris (context {first['contextId']})"}
    # Resuming sent nothing twice: only the answer, to the task that asked, in its context.
    (answer,) = _sent(received, asked)
    assert answer["parts"] == [{"text": "Paris"}] and answer["contextId"] == first["contextId"]
    assert answer["taskId"]
    # The session's next turn is the same conversation: the same context, a new task.
    later = len(received)
    rc, out, err = heddle_inproc(capsys, "run", doc, "--session", "w", "--session-db", db, "--message", "again")
    assert rc == 10, err
    (turn,) = _sent(received, later)
    assert turn["contextId"] == first["contextId"] and "taskId" not in turn


def test_input_required_without_a_session_is_one_line_naming_session(
        remote: tuple[str, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = remote
    rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "ask.json", f"{base}/ask/"), "--message", "weather?")
    assert (rc, out) == (2, "")
    assert err.strip().count("\n") == 0 and "--session" in err and "'remote'" in err


def test_a_failed_remote_task_is_one_line(remote: tuple[str, list[dict[str, Any]]], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = remote
    rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "fail.json", f"{base}/fail/"), "--message", "hi")
    assert (rc, out) == (1, "")
    assert err.strip() == (f"error: A2AAgent 'remote' ({base}/fail/): the remote task failed: the remote agent "
                           "broke")


@pytest.mark.parametrize(("path", "says"), [("/nothing/", "HTTP Error 404"),
                                           ("/garbage/", "its answer is not one the A2A protocol defines")])
def test_a_remote_that_does_not_answer_a2a_is_one_line(remote: tuple[str, list[dict[str, Any]]], path: str, says: str,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = remote
    rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "odd.json", base + path), "--message", "hi")
    assert (rc, out) == (1, "")
    assert err.strip().count("\n") == 0 and err.startswith(f"error: A2AAgent 'remote' ({base}{path}): ") and says in err


def test_a_task_still_working_at_the_session_timeout_is_one_line(
        remote: tuple[str, list[dict[str, Any]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, received = remote
    doc = _doc(tmp_path / "slow.json", f"{base}/slow/")
    written = json.loads(doc.read_text())
    doc.write_text(json.dumps({**written, "session_parameters": {"timeout": 0.3, "poll_interval": 0.05}}))
    since = len(received)
    rc, out, err = heddle_inproc(capsys, "run", doc, "--message", "hi")
    assert (rc, out) == (1, "")
    assert err.strip() == (f"error: A2AAgent 'remote' ({base}/slow/): the remote task did not finish within 0.3 "
                           "seconds (session_parameters.timeout)")
    # polled at once, then again every poll_interval
    assert [r["method"] for r in received[since:]][:3] == ["SendMessage", "GetTask", "GetTask"]


def test_the_answer_is_read_within_the_response_cap(remote: tuple[str, list[dict[str, Any]]], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = remote
    rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "echo.json", f"{base}/echo/"), "--message", "hi",
                                 "--max-response-bytes", "64")
    assert (rc, out) == (1, "")
    assert err.strip().count("\n") == 0
    assert "A2AAgent 'remote'" in err and "over 64 bytes once decoded" in err and "--max-response-bytes" in err


def test_a_server_that_is_not_there_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: bound, never listened to
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "gone.json", url), "--message", "hi")
    assert (rc, out) == (1, "")
    assert err.strip().count("\n") == 0 and err.startswith(f"error: A2AAgent 'remote' ({url}): sending the message")


def _agent(**fields: Any) -> dict[str, Any]:
    return {"component_type": "A2AAgent", "id": "remote", "name": "remote", "agent_url": "http://127.0.0.1:9/",
            "connection_config": {"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc"}, **fields}


def _llm() -> dict[str, Any]:
    return {"component_type": "OpenAiCompatibleConfig", "id": "llm", "name": "llm", "model_id": "m",
            "url": "http://127.0.0.1:9/v1"}


def _in_agent_node() -> dict[str, Any]:
    start = {"component_type": "StartNode", "id": "s", "name": "start"}
    node = {"component_type": "AgentNode", "id": "a", "name": "ask", "agent": _agent()}
    end = {"component_type": "EndNode", "id": "e", "name": "end"}
    return {"component_type": "Flow", "id": "f", "name": "f", "start_node": start, "nodes": [start, node, end],
            "control_flow_connections": [
                {"component_type": "ControlFlowEdge", "id": "c1", "name": "c1", "from_node": start, "to_node": node},
                {"component_type": "ControlFlowEdge", "id": "c2", "name": "c2", "from_node": node, "to_node": end}],
            "agentspec_version": "26.1.0"}


def _in_swarm() -> dict[str, Any]:
    first = {"component_type": "Agent", "id": "a1", "name": "first", "llm_config": _llm(), "system_prompt": "hi"}
    return {"component_type": "Swarm", "id": "sw", "name": "sw", "first_agent": first,
            "relationships": [[first, _agent()]], "agentspec_version": "26.1.0"}


@pytest.mark.parametrize(("document", "expected"), [
    (_in_agent_node(), "AgentNode 'ask': its agent is an A2AAgent, which the reference runtime refuses"),
    (_in_swarm(), "relationships[0][1] is an A2AAgent"),
    ({**_agent(outputs=[{"title": "answer", "type": "string"}]), "agentspec_version": "26.1.0"},
     "A2AAgent 'remote': it declares outputs"),
    ({**_agent(inputs=[{"title": "city", "type": "string"}]), "agentspec_version": "26.1.0"},
     "A2AAgent 'remote': it declares inputs"),
    ({**_agent(agent_url="ftp://host/agent"), "agentspec_version": "26.1.0"}, "agent_url 'ftp://host/agent'"),
    ({**_agent(connection_config={"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc",
                                  "retry_policy": {"max_attempts": 3}}), "agentspec_version": "26.1.2"},
     "A2AConnectionConfig 'cc': retry_policy"),
    ({**_agent(connection_config={"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc",
                                  "verify": False, "ssl_ca_cert": "ca.pem"}), "agentspec_version": "26.1.0"},
     "verify is false and ssl_ca_cert is given"),
    ({**_agent(connection_config={"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc",
                                  "key_file": "k.pem"}), "agentspec_version": "26.1.0"},
     "key_file and cert_file go together"),
    ({**_agent(session_parameters={"timeout": 5, "polling": 1}), "agentspec_version": "26.1.0"}, "polling"),
    # heddle's own secret never goes to the host a document names
    ({**_agent(connection_config={"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc",
                                  "headers": {"Authorization": f"${SECRET}"}}), "agentspec_version": "26.1.0"},
     "A2AConnectionConfig 'cc' at $.connection_config: headers 'Authorization'"),
])
def test_what_heddle_cannot_run_exactly_is_refused_naming_it(document: dict[str, Any], expected: str,
                                                            tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    rc, _, err = heddle_inproc(capsys, "validate", path)
    assert rc == 2, err
    assert expected in err, err


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], str, str]]:
    """The test certificates, a server that asks for a client certificate (mutual TLS) and one that does
    not, both with a certificate no system store trusts."""
    import ssl

    from tests.support.a2a_server import certificates, served

    certs = certificates(tmp_path_factory.mktemp("certs"))
    server = {"ssl_certfile": certs["server_cert"], "ssl_keyfile": certs["server_key"]}
    with served(**server, ssl_ca_certs=certs["ca"], ssl_cert_reqs=ssl.CERT_REQUIRED) as (mutual, _), \
            served(**server) as (plain, _):
        yield certs, mutual, plain


@pytest.mark.parametrize(("server", "connection", "answers"), [
    # ssl_ca_cert is the CA the server is checked against; key_file and cert_file the client's own
    ("mutual", {"ssl_ca_cert": "ca", "key_file": "client_key", "cert_file": "client_cert"}, True),
    ("mutual", {"ssl_ca_cert": "ca"}, False),  # no client certificate: the server refuses
    ("plain", {"ssl_ca_cert": "ca"}, True),
    ("plain", {}, False),  # the system's store does not know the test CA
    ("plain", {"verify": False}, True),  # the document's own choice, as the reference runtime takes it
])
def test_connection_config_tls_fields_are_honoured(tls: tuple[dict[str, str], str, str], server: str,
                                                   connection: dict[str, Any], answers: bool, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    certs, mutual, plain = tls
    base = mutual if server == "mutual" else plain
    fields = {key: certs[value] if isinstance(value, str) else value for key, value in connection.items()}
    rc, out, err = heddle_inproc(capsys, "run", _doc(tmp_path / "tls.json", f"{base}/echo/", **fields),
                                 "--message", "over tls")
    if answers:
        assert (rc, json.loads(out)) == (0, {"result": "echo: over tls"}), err
    else:
        assert (rc, out) == (1, "")
        assert err.strip().count("\n") == 0 and err.startswith(f"error: A2AAgent 'remote' ({base}/echo/): sending")


def test_the_a2a_client_is_imported_only_to_talk_to_a_remote_agent(tmp_path: Path) -> None:
    import subprocess
    import sys

    doc = _doc(tmp_path / "remote.json", "http://127.0.0.1:9/")
    # the document read and checked, the engine that would run it loaded
    check = ("import sys\nimport heddle.engine.agent\nfrom heddle.graph import check_flow\n"
             "from heddle.agentspec import load_flow\nassert check_flow(load_flow(sys.argv[1])) == []\n"
             "print('a2a' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", check, str(doc)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_a_request_to_the_server_keeps_the_url_rules(remote: tuple[str, list[dict[str, Any]]],
                                                     tmp_path: Path) -> None:
    """A flow sent in a request may not aim the server at its own network (unless --allow-net names the
    host), read its environment or read its files; an A2AAgent's agent_url is held to the model URLs' rules."""
    from tests.support.server_thread import threaded_server

    base, _ = remote
    doc = json.loads(_doc(tmp_path / "echo.json", f"{base}/echo/").read_text())
    secret = {**doc, "connection_config": {**doc["connection_config"], "headers": {"X-Token": "$HOME"}}}
    files = {**doc, "connection_config": {**doc["connection_config"], "ssl_ca_cert": "/etc/ssl/certs/ca.pem"}}
    # localhost is not the host --allow-net names, and it resolves to this machine
    local = {**doc, "agent_url": doc["agent_url"].replace("127.0.0.1", "localhost")}
    with threaded_server(tmp_path / "srv", "--allow-net", "127.0.0.1") as server, server.client() as client:
        inside = client.post("/v1/runs", json={"flow": local, "message": "hi"})
        allowed = client.post("/v1/runs", json={"flow": doc, "message": "hi"})
        read_env = client.post("/v1/runs", json={"flow": secret, "message": "hi"})
        read_file = client.post("/v1/runs", json={"flow": files, "message": "hi"})
    assert inside.status_code == 400 and inside.json()["error"]["type"] == "forbidden_url"
    assert inside.json()["error"]["message"].startswith("A2AAgent 'remote' at $: agent_url")
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["outputs"] == {"result": "echo: hi"}
    assert (read_env.status_code, read_env.json()["error"]["type"]) == (400, "forbidden_key")
    assert (read_file.status_code, read_file.json()["error"]["type"]) == (400, "forbidden_field")
