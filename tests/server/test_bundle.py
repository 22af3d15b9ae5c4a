"""`heddle-server --bundle`: verified before the port opens, then served and nothing else.

Bundles are made with the real CLI (`heddle keygen`, `heddle bundle`), as a user makes them.
"""

from __future__ import annotations

import json

import pytest

from tests.server.flows import ECHO, tool_chain, write_tools
from tests.server.support import fuzz, metric, run_server_to_exit, start_server
from tests.support.cli import heddle


@pytest.fixture
def private_home(tmp_path, monkeypatch):
    """A trust store, cache and HOME of the test's own, for every `heddle` and server it starts."""
    for name in ("trust", "cache", "home"):
        (tmp_path / name).mkdir()
    env = {"HEDDLE_TRUST_DIR": str(tmp_path / "trust"), "HEDDLE_CACHE_DIR": str(tmp_path / "cache"),
           "HOME": str(tmp_path / "home")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def sealed(tmp_path, *, sign: bool = True):
    tools = write_tools(tmp_path / "tools", {"fetch": ECHO, "shape": ECHO, "store": ECHO})
    flow = tool_chain("three-steps", ["fetch", "shape", "store"]).write(tmp_path / "flow.json")
    made = heddle("keygen", "--out", tmp_path / "me", "--no-passphrase")
    assert made.returncode == 0, made.stderr
    out = tmp_path / ("app.heddle" if sign else "unsigned.heddle")
    args = ["bundle", flow, "--tools-dir", tools, "--input", '{"x": "recorded"}', "-o", out]
    if sign:
        args += ["--sign-key", tmp_path / "me.key"]
    proc = heddle(*args)
    assert proc.returncode == 0, proc.stderr
    return out, tmp_path / "me.pub", flow, tools, made.stdout.strip()


def test_a_bundle_is_served_and_described(tmp_path, private_home):
    bundle, pub, flow, tools, keyid = sealed(tmp_path)
    info = json.loads(heddle("inspect", bundle, "--json", "--trust", pub).stdout)
    report = json.loads(heddle("validate", flow, "--tools-dir", tools, "--json").stdout)
    server = start_server(tmp_path, "--bundle", bundle, "--trust", pub)
    try:
        with server.client() as client:
            caps = client.get("/v1/capabilities").json()
            name = info["manifest"]["name"]
            assert caps["bundle"]["name"] == name
            assert caps["bundle"]["digest"] == "sha256:" + info["digest"].removeprefix("sha256:")
            assert caps["bundle"]["signers"] == [keyid]
            assert caps["bundle"]["tools"] == {row["name"]: row["fingerprint"] for row in report["tools"]}
            assert caps["acceptsFlowPath"] is False and caps["allowRequestCode"] is False
            assert caps["tools"] == ["fetch", "shape", "store"]

            response = client.post("/v1/runs", json={})
            assert response.status_code == 200, response.text
            body = response.json()  # issue 11: the outputs come beside the state
            assert {k: body[k] for k in ("flow", "state")} == {"flow": "three-steps", "state": {"x": "recorded"}}
            assert set(body) == {"flow", "state", "outputs"}
            response = client.post("/v1/runs", json={"inputs": {"x": "mine", "y": 2}})
            assert response.json()["state"] == {"x": "mine", "y": 2}
            assert "event: flow_complete" in client.post("/v1/runs?stream=true", content=b"").text

            for body in ({"flow": json.loads(flow.read_text())}, {"flowPath": "flow.json"},
                         {"tools": [{"name": "t", "source": "x"}]}):
                response = client.post("/v1/runs", json=body)
                assert response.status_code == 400, body
                err = response.json()["error"]
                assert err["type"] in ("bundle_only", "request_code_disabled")
            err = client.post("/v1/runs", json={"flowPath": "flow.json"}).json()["error"]
            assert f"runs the bundle {name!r}" in err["message"] and caps["bundle"]["digest"] in err["message"]

            report = client.post("/v1/validate", json={}).json()
            assert report["valid"] is True and report["bundle"]["name"] == name
    finally:
        assert server.stop() == 0


def test_a_tampered_or_untrusted_bundle_never_serves(tmp_path, private_home):
    bundle, pub, *_ = sealed(tmp_path)
    tampered = tmp_path / "tampered.heddle"
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    assert heddle("keygen", "--out", tmp_path / "other", "--no-passphrase").returncode == 0
    for target, trust in ((tampered, pub), (bundle, tmp_path / "other.pub")):
        expected = heddle("verify", target, "--trust", trust).returncode
        assert expected not in (0, 1, 2)
        proc = run_server_to_exit(tmp_path, "--bundle", target, "--trust", trust)
        assert proc.returncode == expected, proc.stderr
        assert "listening" not in proc.stdout
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, proc.stderr
    proc = run_server_to_exit(tmp_path, "--bundle", tmp_path / "missing.heddle", "--trust", pub)
    assert proc.returncode != 0 and "listening" not in proc.stdout


def test_an_unsigned_bundle_needs_allow_unsigned(tmp_path, private_home):
    bundle, *_ = sealed(tmp_path, sign=False)
    proc = run_server_to_exit(tmp_path, "--bundle", bundle)
    assert proc.returncode == heddle("verify", bundle).returncode == 3
    server = start_server(tmp_path, "--bundle", bundle, "--allow-unsigned")
    try:
        with server.client() as client:
            caps = client.get("/v1/capabilities").json()
            assert caps["bundle"]["signers"] == []
            assert client.post("/v1/runs", json={}).json()["state"] == {"x": "recorded"}
    finally:
        server.stop()


def test_fuzzing_a_bundle_server_finds_no_500(tmp_path, private_home):
    bundle, pub, *_ = sealed(tmp_path)
    work = tmp_path / "work"
    server = start_server(tmp_path, "--bundle", bundle, "--trust", pub, "--auth-token", "fuzz", "--work-dir", work)
    try:
        proc = fuzz(server, tmp_path, "fuzz", 10, "--include-path", "/v1/runs")
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        with server.client("fuzz") as client:
            # Generated inputs really ran the sealed flow, not only bounced off the checks.
            assert metric(client.get("/metrics").text, "heddle_runs_accepted_total") > 0
        # Every run's workspace is gone, and a bundle with no rw mount has no data folder either.
        assert list(work.iterdir()) == []
    finally:
        assert server.stop() == 0
    assert list(work.iterdir()) == []


def test_an_unlimited_tool_round_proposal_is_served(tmp_path, private_home):
    from tests.server.flows import agent_flow
    from tests.support.flows import server_tool
    from tests.support.scripted_model import scripted_model

    # The limit is compared after every round that calls a tool: one is enough.
    script = [{"tool_calls": [{"name": "echo", "arguments": {"message": "hi"}}]}, {"content": "done"}]
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    made = heddle("keygen", "--out", tmp_path / "me", "--no-passphrase")
    assert made.returncode == 0, made.stderr
    with scripted_model(script, tmp_path, ["--loop"]) as model:
        flow = agent_flow("agent", model.url, tools=[server_tool("echo", ["message"])]).write(tmp_path / "flow.json")
        bundle = tmp_path / "agent.heddle"
        proc = heddle("bundle", flow, "--tools-dir", tools, "--max-tool-rounds", "unlimited",
                      "--sign-key", tmp_path / "me.key", "-o", bundle)
        assert proc.returncode == 0, proc.stderr
        server = start_server(tmp_path, "--bundle", bundle, "--trust", tmp_path / "me.pub")
        try:
            with server.client() as client:
                assert client.get("/v1/capabilities").json()["limits"]["maxToolRounds"] is None
                for _ in range(2):
                    response = client.post("/v1/runs", json={"inputs": {"query": "q"}})
                    assert response.status_code == 200, response.text
                    assert response.json()["state"]["result"] == "done"
            assert "Traceback" not in server.stderr()
        finally:
            assert server.stop() == 0
