"""A request (or a bundle) that nests deeply is the caller's 400 (or a refusal to start), and the
server stays up: never a RecursionError, never a 500."""

from __future__ import annotations

import json

from heddle import canonical
from heddle.format.signing import PAYLOAD_TYPE
from tests.bundle.conftest import load_make_vectors
from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.server.support import run_server_to_exit, start_server

DEEP = "[" * 5_000 + "]" * 5_000  # past the parsers' own recursion limit
NEEDLE = "nests deeper than"


def test_deep_bodies_inline_flows_and_flow_files_are_400(tmp_path):
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("echo-flow", "echo").write(flows / "echo.json")
    (flows / "deep.json").write_text('{"component_type": "Flow", "metadata": ' + DEEP + "}")
    chain = {f"c{i}": {"x": {"$component_ref": f"c{i + 1}"}} for i in range(1000)} | {"c1000": {"x": 1}}
    bomb = "component_type: Flow\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n" for i in range(1, 9))
    bodies = [
        ('{"flowPath": "echo.json", "inputs": {"x": ' + DEEP + "}}", NEEDLE),
        (json.dumps({"flow": '{"component_type": "Flow", "metadata": ' + DEEP + "}"}), NEEDLE),
        (json.dumps({"flow": "component_type: Flow\nmetadata: " + DEEP}), NEEDLE),
        (json.dumps({"flow": {"component_type": "Flow", "id": "f", "name": "f",
                              "description": {"$component_ref": "c0"}, "$referenced_components": chain}}), NEEDLE),
        (json.dumps({"flowPath": "deep.json"}), NEEDLE),
        (json.dumps({"flow": bomb}), "aliases"),
    ]
    server = start_server(tmp_path, "--tools-dir", tools, "--flows-root", flows)
    try:
        with server.client() as client:
            for route, (body, needle) in [*(("/v1/runs", case) for case in bodies), ("/v1/validate", bodies[1])]:
                response = client.post(route, content=body.encode(), headers={"Content-Type": "application/json"})
                assert response.status_code == 400, (route, body[:80], response.text)
                assert needle in response.json()["error"]["message"], response.text
            assert client.get("/healthz").status_code == 200
            response = client.post("/v1/runs", json={"flowPath": "echo.json", "inputs": {"x": [[1]]}})
            assert response.status_code == 200 and response.json()["state"] == {"x": [[1]]}
    finally:
        server.stop()
    assert "Traceback" not in server.stderr(), server.stderr()


def test_a_bundle_with_deeply_nested_signatures_does_not_start_the_server(tmp_path):
    vectors = load_make_vectors()
    manifest = canonical.dumps(vectors.manifest_obj(vectors.BASE_FILES))
    signatures = b'{"payloadType":"%s","signatures":%s}' % (PAYLOAD_TYPE.encode(), DEEP.encode())
    bundle = tmp_path / "deep.heddle"
    bundle.write_bytes(vectors.archive(vectors.entries(manifest, signatures, vectors.BASE_FILES)))
    proc = run_server_to_exit(tmp_path, "--bundle", bundle, "--allow-unsigned",
                              env={"HEDDLE_CACHE_DIR": str(tmp_path / "cache"),
                                   "HEDDLE_TRUST_DIR": str(tmp_path / "trust")})
    assert proc.returncode == 7 and "listening" not in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {bundle} signatures {NEEDLE} 64 levels"), proc.stderr
