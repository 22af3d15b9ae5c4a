"""`heddle-server --bundle`: verified before the port opens, then served and nothing else.

The bundles and keys are made once per module through the library (`heddle.seal`, the key
generation `heddle keygen` calls): the `heddle bundle` and `heddle keygen` commands have their
own tests in tests/bundle. What a test reads from `heddle inspect`, `validate` or `verify` to
compare with the server comes from those commands run in this process (tests/support/cli_inproc.py).
One server process serves the signed bundle to the tests that only read from it; each refusal is
seen once from a real `heddle-server` process, further refusals through its entry function here;
the other bundles are served from a thread by the same entry function (tests/support/server_thread.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import heddle
from heddle.format.keys import generate
from tests.server.flows import ECHO, tool_chain, write_tools
from tests.server.support import Server, fuzz, metric, run_server_to_exit, start_server
from tests.support.cli import env_with
from tests.support.cli_inproc import heddle_inproc
from tests.support.server_thread import threaded_server
from tests.support.threaded_model import threaded_model

Capsys = pytest.CaptureFixture[str]
Env = dict[str, str]


@pytest.fixture
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A trust store, cache and HOME of the test's own, for every `heddle` and server it starts."""
    for name in ("trust", "cache", "home"):
        (tmp_path / name).mkdir()
    env = {"HEDDLE_TRUST_DIR": str(tmp_path / "trust"), "HEDDLE_CACHE_DIR": str(tmp_path / "cache"),
           "HOME": str(tmp_path / "home")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@dataclass(frozen=True)
class Sealed:
    bundle: Path  # signed by `pub`'s key; no test changes it (a tampered copy is a new file)
    unsigned: Path
    pub: Path
    flow: Path
    tools: Path
    keyid: str


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Sealed:
    root = tmp_path_factory.mktemp("sealed")
    tools = write_tools(root / "tools", {"fetch": ECHO, "shape": ECHO, "store": ECHO})
    flow = tool_chain("three-steps", ["fetch", "shape", "store"]).write(root / "flow.json")
    made = generate(root / "me", None)
    signed = heddle.seal(flow, tools_dir=tools, input={"x": "recorded"}, sign_key=made.private_path,
                         output=root / "app.heddle")
    unsigned = heddle.seal(flow, tools_dir=tools, input={"x": "recorded"}, output=root / "unsigned.heddle")
    return Sealed(signed.path, unsigned.path, made.public_path, flow, tools, made.keyid)


@dataclass(frozen=True)
class Serving:
    server: Server
    work: Path


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory, sealed: Sealed) -> Iterator[Serving]:
    """`heddle-server --bundle` for the signed bundle, behind a token, its runs' workspaces under `work`."""
    root = tmp_path_factory.mktemp("serving")
    for name in ("trust", "cache", "home"):
        (root / name).mkdir()
    env = {"HEDDLE_TRUST_DIR": str(root / "trust"), "HEDDLE_CACHE_DIR": str(root / "cache"), "HOME": str(root / "home")}
    work = root / "work"
    server = start_server(root, "--bundle", sealed.bundle, "--trust", sealed.pub, "--auth-token", "fuzz",
                          "--work-dir", work, env=env)
    try:
        yield Serving(server, work)
    finally:
        assert server.stop() == 0
    assert list(work.iterdir()) == []


def refused_in_process(monkeypatch: pytest.MonkeyPatch, capsys: Capsys, *args: object) -> tuple[int, str, str]:
    """(status, stdout, stderr) of a `heddle-server ARGS` that must refuse, by its entry function here."""
    from heddle.server.cli import run

    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # a refusal must not leave it pointed elsewhere
    capsys.readouterr()
    status = run(["--port", "0", *[str(a) for a in args]], env_with())
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_bundle_is_served_and_described(private_home: Env, sealed: Sealed, serving: Serving, capsys: Capsys) -> None:
    bundle, pub, flow, tools, keyid = sealed.bundle, sealed.pub, sealed.flow, sealed.tools, sealed.keyid
    info = json.loads(heddle_inproc(capsys, "inspect", bundle, "--json", "--trust", pub)[1])
    report = json.loads(heddle_inproc(capsys, "validate", flow, "--tools-dir", tools, "--json")[1])
    with serving.server.client("fuzz") as client:
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
    # Every run's workspace is gone, and a bundle with no rw mount has no data folder either.
    assert list(serving.work.iterdir()) == []


def test_a_tampered_or_untrusted_bundle_never_serves(tmp_path: Path, private_home: Env, sealed: Sealed, capsys: Capsys,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bundle, pub = sealed.bundle, sealed.pub
    tampered = tmp_path / "tampered.heddle"
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    other = generate(tmp_path / "other", None)
    # The real process for the tampered bundle; the untrusted signer through the same entry function.
    for target, trust, real in ((tampered, pub, True), (bundle, other.public_path, False)):
        expected = heddle_inproc(capsys, "verify", target, "--trust", trust)[0]
        assert expected not in (0, 1, 2)
        if real:
            proc = run_server_to_exit(tmp_path, "--bundle", target, "--trust", trust)
            status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        else:
            status, stdout, stderr = refused_in_process(monkeypatch, capsys, "--bundle", target, "--trust", trust)
        assert status == expected, stderr
        assert "listening" not in stdout
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, stderr
    status, stdout, _ = refused_in_process(monkeypatch, capsys, "--bundle", tmp_path / "missing.heddle",
                                           "--trust", pub)
    assert status != 0 and "listening" not in stdout


def test_an_unsigned_bundle_needs_allow_unsigned(tmp_path: Path, private_home: Env, sealed: Sealed, capsys: Capsys,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = sealed.unsigned
    # The refusal as a process is test_a_tampered_or_untrusted_bundle_never_serves's; serving is this one's.
    status = refused_in_process(monkeypatch, capsys, "--bundle", bundle)[0]
    assert status == heddle_inproc(capsys, "verify", bundle)[0] == 3
    with threaded_server(tmp_path, "--bundle", bundle, "--allow-unsigned") as server, server.client() as client:
        caps = client.get("/v1/capabilities").json()
        assert caps["bundle"]["signers"] == []
        assert client.post("/v1/runs", json={}).json()["state"] == {"x": "recorded"}


def test_fuzzing_a_bundle_server_finds_no_500(tmp_path: Path, serving: Serving) -> None:
    server, work = serving.server, serving.work
    with server.client("fuzz") as client:
        before = metric(client.get("/metrics").text, "heddle_runs_accepted_total")
    # Three derandomized examples, valid and invalid bodies: each valid one runs the sealed flow.
    proc = fuzz(server, tmp_path, "fuzz", 3, "--include-path", "/v1/runs")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    with server.client("fuzz") as client:
        # Generated inputs really ran the sealed flow, not only bounced off the checks.
        assert metric(client.get("/metrics").text, "heddle_runs_accepted_total") > before
    # Every run's workspace is gone, and a bundle with no rw mount has no data folder either
    # (and still none once the server has stopped: the `serving` fixture checks that).
    assert list(work.iterdir()) == []


def test_an_unlimited_tool_round_proposal_is_served(tmp_path: Path, private_home: Env, capsys: Capsys) -> None:
    from tests.server.flows import agent_flow
    from tests.support.flows import server_tool
    # The limit is compared after every round that calls a tool: one is enough.
    script: list[dict[str, Any]] = [{"tool_calls": [{"name": "echo", "arguments": {"message": "hi"}}]},
                                    {"content": "done"}]
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    made = generate(tmp_path / "me", None)
    with threaded_model(script, loop=True) as model:
        flow = agent_flow("agent", model.url, tools=[server_tool("echo", ["message"])]).write(tmp_path / "flow.json")
        bundle = heddle.seal(flow, tools_dir=tools, max_tool_rounds="unlimited", sign_key=made.private_path,
                             output=tmp_path / "agent.heddle").path
        capsys.readouterr()
        with threaded_server(tmp_path, "--bundle", bundle, "--trust", made.public_path) as server:
            with server.client() as client:
                assert client.get("/v1/capabilities").json()["limits"]["maxToolRounds"] is None
                for _ in range(2):
                    response = client.post("/v1/runs", json={"inputs": {"query": "q"}})
                    assert response.status_code == 200, response.text
                    assert response.json()["state"]["result"] == "done"
            assert server.stop() == 0
        assert "Traceback" not in capsys.readouterr().err
