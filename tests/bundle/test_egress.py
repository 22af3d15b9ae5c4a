"""Egress allow-lists: declared at sealing (`--egress`, `--egress-file`, the commands file), derived from the
document's URLs, sealed in the manifest (old manifests still read), shown by `inspect`, compared by
`diff`, and obeyed by heddle's own requests for the document (RemoteTool here; the model's URL before
the run starts)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

import heddle
from heddle.egress import EgressError, EgressPolicy, Rule, parse_flag, parse_rules, url_rule
from heddle.format.errors import MalformedBundleError
from heddle.format.manifest import Manifest
from heddle.format.verify import peek
from heddle.settings import RunSettings
from tests.bundle.conftest import VECTORS
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, prop


class _Api(BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        if self.path == "/other-port":
            # The same host, another port: redirects stay on the host, and the port is the list's to admit.
            self.send_response(302)
            self.send_header("location", "http://127.0.0.1:9/echo")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        data = json.dumps({"path": self.path, "n": 1}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def remote_flow(root: Path, url: str, *, name: str = "fetch") -> Path:
    tool = {"component_type": "RemoteTool", "id": f"remote-{name}", "name": name, "description": "an API",
            "url": url, "http_method": "GET", "inputs": [], "outputs": [prop("answer")]}
    # The tool's one output is the answer's text, as the reference runtime (WayFlow) gives it.
    f = FlowDoc("egress")
    s = f.start([])
    t = f.tool_node("call", tool)
    e = f.end(["answer"])
    f.control(s, t)
    f.control(t, e)
    root.mkdir(parents=True, exist_ok=True)
    return f.write(root / "flow.json")


def llm_flow(root: Path, url: str) -> Path:
    f = FlowDoc("egress-llm")
    s = f.start([])
    n = f.llm("ask", llm_config(url, name="brain"), "hi")
    e = f.end(["generated_text"])
    f.control(s, n)
    f.control(n, e)
    root.mkdir(parents=True, exist_ok=True)
    return f.write(root / "flow.json")


def sealed(sandbox: Path, flow: Path, **kwargs: Any) -> Path:
    out = sandbox / f"{kwargs.pop('stem', 'app')}.heddle"
    heddle.seal(flow, output=out, **kwargs)
    return out


def run_bundle(path: Path, **settings: Any) -> dict[str, Any]:
    bundle = heddle.open_bundle(path, trust=heddle.TrustPolicy.allow_unsigned())
    return dict(heddle.run(bundle, settings=RunSettings(**settings)).state)


# ------------------------------------------------------------------ rules


def test_rules_read_exactly() -> None:
    assert [str(r) for r in parse_rules("API.Example.com.,*.example.org:8443,[::1]:9,10.0.0.1", "x")] == [
        "*.example.org:8443", "10.0.0.1", "[::1]:9", "api.example.com"]
    for bad in ("*", "*.com", "a..b", "x:0", "x:65536", "[::1", "exa mple.com", "http://x.com", ""):
        with pytest.raises(EgressError):
            Rule.parse(bad)
    assert parse_flag("fetch=api.example.com, db.example.com:5432") == (
        "fetch", (Rule("api.example.com"), Rule("db.example.com", 5432)))
    with pytest.raises(EgressError, match="TOOL=HOST"):
        parse_flag("api.example.com")
    policy = EgressPolicy({"t": parse_rules("*.example.com,localhost:8000", "x")})
    # A wildcard is the subdomains, not the name; no port is 443 and 80 alone.
    assert policy.problem("t", "a.b.example.com", 443) is None and policy.problem("t", "x.example.com", 80) is None
    assert "example.com:443 is not on the egress allow-list of 't'" in (policy.problem("t", "example.com", 443) or "")
    assert policy.problem("t", "a.example.com", 22) is not None
    assert policy.problem("t", "LOCALHOST.", 8000) is None and policy.problem("t", "localhost", 8001) is not None
    assert policy.problem("other", "localhost", 8000) is not None  # a component not listed reaches nothing
    assert str(url_rule("https://api.example.com/v1/{{path}}")) == "api.example.com:443"
    assert url_rule("http://{{host}}/x") is None and url_rule("$MODEL_URL") is None


# ------------------------------------------------------------------ sealing


def test_nothing_declared_seals_nothing_and_old_manifests_read(sandbox: Path, api: str) -> None:
    out = sealed(sandbox, remote_flow(sandbox / "src", api + "/echo"))
    manifest = peek(out).manifest
    assert manifest.egress is None and "egress" not in manifest.to_json()
    # The committed vectors were sealed before egress existed: they read as they did.
    assert peek(VECTORS / "valid-signed.heddle").manifest.egress is None
    # Without a list, a run is what it always was.
    assert json.loads(run_bundle(out)["answer"])["path"] == "/echo"


def test_declared_egress_is_sealed_with_the_document_urls(sandbox: Path, api: str) -> None:
    flow = remote_flow(sandbox / "src", api + "/echo")
    egress_file = sandbox / "egress.yaml"
    egress_file.write_text("egress:\n  fetch: [mirror.example.com]\n  helper: ['*.example.org:8443']\n")
    out = sealed(sandbox, flow, egress=["helper=files.example.net"], egress_file=egress_file)
    port = api.rsplit(":", 1)[1]
    assert peek(out).manifest.egress == {
        "fetch": (f"127.0.0.1:{port}", "mirror.example.com"),
        "helper": ("*.example.org:8443", "files.example.net")}
    # The listed host is reached as before.
    assert json.loads(run_bundle(out)["answer"])["path"] == "/echo"


def test_a_url_without_a_fixed_host_must_be_declared(sandbox: Path) -> None:
    flow = llm_flow(sandbox / "src", "$MODEL_URL")
    with pytest.raises(heddle.UsageError, match=r"llm config 'brain' .* has no fixed host .* --egress brain="):
        sealed(sandbox, flow, egress=["other=example.com"])
    out = sealed(sandbox, flow, egress=["brain=models.example.com"])
    assert peek(out).manifest.egress == {"brain": ("models.example.com",)}


def test_bad_declarations_are_refused_in_one_line(sandbox: Path, api: str, capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    flow = remote_flow(sandbox / "src", api + "/echo")
    proc = heddle_here(capsys, "bundle", flow, "--egress", "fetch=*", "-o", sandbox / "x.heddle")
    assert proc.returncode != 0 and "--egress 'fetch=*'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    bad = sandbox / "bad.yaml"
    bad.write_text("egress: [a.example.com]\n")
    proc = heddle_here(capsys, "bundle", flow, "--egress-file", bad, "-o", sandbox / "x.heddle")
    assert proc.returncode != 0 and "must be a mapping of tool name" in proc.stderr
    assert not (sandbox / "x.heddle").exists()


def test_the_commands_file_declares_its_commands_egress(sandbox: Path) -> None:
    from heddle.tools.commands import read_commands
    from tests.support.commands import entry

    path = sandbox / "commands.json"
    path.write_text(json.dumps({"commands": [entry()], "egress": {"day_of": ["api.example.com:8443"]}}))
    assert read_commands(path).egress == {"day_of": (Rule("api.example.com", 8443),)}
    path.write_text(json.dumps({"commands": [entry()], "egress": {"nosuch": ["api.example.com"]}}))
    with pytest.raises(heddle.UsageError, match=r"egress\.nosuch: is not one of the file's commands"):
        read_commands(path)


def test_the_manifest_field_is_checked(sandbox: Path) -> None:
    base = peek(VECTORS / "valid-signed.heddle").manifest.to_json()
    good = Manifest.from_json({**base, "egress": {"fetch": ["127.0.0.1:8080", "api.example.com"]}})
    assert good.egress == {"fetch": ("127.0.0.1:8080", "api.example.com")}
    assert Manifest.from_bytes(good.to_bytes()).egress == good.egress
    for bad, why in (({"fetch": ["api.example.com", "127.0.0.1:8080"]}, "canonical form"),
                     ({"fetch": ["API.example.com"]}, "canonical form"),
                     ({"fetch": ["a.example.com", "a.example.com"]}, "canonical form"),
                     ({"fetch": []}, "list of 1 to"),
                     ({"fetch": ["*"]}, "is not HOST"),
                     ([], "must be a JSON object")):
        with pytest.raises(MalformedBundleError, match=why):
            Manifest.from_json({**base, "egress": bad})


# ------------------------------------------------------------------ inspect and diff


def test_inspect_shows_and_diff_compares(sandbox: Path, api: str, capsys: pytest.CaptureFixture[str]) -> None:
    flow = remote_flow(sandbox / "src", api + "/echo")
    before = sealed(sandbox, flow, stem="before")
    after = sealed(sandbox, flow, stem="after", egress=["fetch=mirror.example.com"])
    shown = heddle_here(capsys, "inspect", after).stdout
    port = api.rsplit(":", 1)[1]
    assert f"fetch                127.0.0.1:{port}, mirror.example.com" in shown
    assert "egress     not declared" in heddle_here(capsys, "inspect", before).stdout
    proc = heddle_here(capsys, "diff", before, after)
    assert "~ egress (declared): no (any host) -> yes" in proc.stdout
    assert f'~ egress fetch: [] -> ["127.0.0.1:{port}", "mirror.example.com"]' in proc.stdout


# ------------------------------------------------------------------ heddle's own requests obey it


def test_a_remote_tool_reaches_only_its_list(sandbox: Path, api: str) -> None:
    _Api.paths.clear()
    out = sealed(sandbox, remote_flow(sandbox / "src", api + "/other-port"), egress=["unrelated=example.com"])
    with pytest.raises(heddle.HeddleError) as caught:
        run_bundle(out)
    message = str(caught.value)
    assert "egress refused: 127.0.0.1:9 is not on the egress allow-list of 'fetch'" in message
    assert _Api.paths == ["/other-port"]  # the refused hop was never sent


def test_the_model_url_is_checked_before_the_run(sandbox: Path) -> None:
    out = sealed(sandbox, llm_flow(sandbox / "src", "http://models.example.com/v1"), egress=["x=example.com"])
    assert peek(out).manifest.egress == {"brain": ("models.example.com:80",), "x": ("example.com",)}
    # --model-url sends the model elsewhere: a host the bundle did not list is refused before anything runs.
    with pytest.raises(heddle.UsageError, match=r"llm config 'brain' .*egress refused: 127\.0\.0\.1:1 is not on"):
        run_bundle(out, model_urls=("brain=http://127.0.0.1:1/v1",))


def _run_with_egress(flow: Path, inputs: dict[str, Any], egress: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """A document run as a bundle with the sealed `egress` runs it."""
    import asyncio

    from heddle.engine.options import with_egress
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow

    prepared = prepare_run(load_flow(flow), tools={}, tools_dir=None,
                           options=with_egress(RunSettings(tool_timeout=20).run_options(), egress))
    return asyncio.run(run_prepared(prepared, inputs)).state


def test_an_api_node_obeys_its_list(tmp_path: Path, api: str) -> None:
    f = FlowDoc("egress-api")
    s = f.start([])
    a = f._node("ApiNode", "call", [], [prop("path"), prop("n", "integer")], url=api + "/other-port",
                http_method="GET")
    e = f.end(["path", "n"])
    f.control(s, a)
    f.control(a, e)
    flow = f.write(tmp_path / "flow.json")
    port = api.rsplit(":", 1)[1]
    with pytest.raises(heddle.HeddleError, match=r"ApiNode 'call'.*egress refused: 127\.0\.0\.1:9 .* of 'call'"):
        _run_with_egress(flow, {}, {"call": (f"127.0.0.1:{port}",)})


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[str]:
    """An MCP server over streamable HTTP on loopback, with one tool, `add`."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("heddle-egress-test")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    runner = uvicorn.Server(uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=0,
                                           log_level="error"))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        threading.Event().wait(0.01)
    yield f"http://127.0.0.1:{runner.servers[0].sockets[0].getsockname()[1]}"
    runner.should_exit = True
    thread.join(10)


def test_an_mcp_transport_obeys_its_list(tmp_path: Path, mcp_server: str) -> None:
    base = mcp_server
    transport = {"component_type": "StreamableHTTPTransport", "id": "http", "name": "adder", "url": base + "/mcp"}
    ab = [prop("a", "integer"), prop("b", "integer")]
    f = FlowDoc("mcp-add")
    start = f.start(ab)
    node = f.tool_node("sum", {"component_type": "MCPTool", "id": "mcp-add", "name": "add",
                               "client_transport": transport, "outputs": [prop("total", "integer")]}, inputs=ab)
    end = f.end([prop("total", "integer")])
    f.control(start, node)
    f.control(node, end)
    flow = f.write(tmp_path / "flow.json")
    port = base.rsplit(":", 1)[1]
    assert _run_with_egress(flow, {"a": 40, "b": 2}, {"adder": (f"127.0.0.1:{port}",)})["total"] == 42
    with pytest.raises(heddle.HeddleError, match=rf"127\.0\.0\.1:{port} is not on the egress allow-list of 'adder'"):
        _run_with_egress(flow, {"a": 40, "b": 2}, {"adder": ("mcp.example.com",)})


def test_a_plugin_manifest_declares_its_tools_egress(sandbox: Path, api: str) -> None:
    from heddle.plugin_host.errors import PluginLoadError
    from heddle.plugin_host.manifest import load_manifest
    from tests.plugins.support import make_plugin

    manifest = make_plugin(sandbox / "p", name="p", egress={"p": ["hooks.example.com"]})
    assert load_manifest(manifest).egress == {"p": (Rule("hooks.example.com"),)}
    out = sealed(sandbox, remote_flow(sandbox / "src", api + "/echo"), plugins=[manifest])
    assert peek(out).manifest.egress == {"fetch": (f"127.0.0.1:{api.rsplit(':', 1)[1]}",),
                                         "p": ("hooks.example.com",)}
    wrong = make_plugin(sandbox / "q", name="q", egress={"someone": ["hooks.example.com"]})
    with pytest.raises(PluginLoadError, match=r"egress\.someone: is neither one of the plugin's tools"):
        load_manifest(wrong)


def test_secrets_are_declared_and_sealed_without_their_values(sandbox: Path, api: str, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GH_TOKEN", "the-value-itself")
    flow = remote_flow(sandbox / "src", api + "/echo")
    egress_file = sandbox / "egress.yaml"
    egress_file.write_text("secrets:\n  KEY:\n    file: /run/secrets/key\n    hosts: [files.example.com]\n"
                           "    header: 'X-Api-Key: {}'\n")
    out = sealed(sandbox, flow, secrets=["TOKEN=GH_TOKEN@api.github.com,UPLOADS.github.com:8443"],
                 egress_file=egress_file)
    manifest = peek(out).manifest
    assert manifest.secrets == {
        "KEY": {"file": "/run/secrets/key", "header": "X-Api-Key: {}", "hosts": ["files.example.com"]},
        "TOKEN": {"env": "GH_TOKEN", "header": "Authorization: Bearer {}",
                  "hosts": ["api.github.com", "uploads.github.com:8443"]}}
    # A secret declared is a declaration: the list is sealed (here, the document's own URL).
    assert manifest.egress is not None and set(manifest.egress) == {"fetch"}
    assert b"the-value-itself" not in out.read_bytes()
    shown = heddle_here(capsys, "inspect", out).stdout
    assert "secret     TOKEN from $GH_TOKEN, sent as 'Authorization: Bearer {}' to api.github.com" in shown
    for flag, why in (("TOKEN=GH_TOKEN", "NAME=ENV@HOST"), ("PATH=GH_TOKEN@a.example.com", "heddle sets"),
                      ("HEDDLE_AUTH_TOKEN=X@a.example.com", "heddle sets or keeps"),
                      ("TOKEN=GH TOKEN@a.example.com", "not an environment variable name")):
        with pytest.raises(heddle.UsageError, match=why):
            sealed(sandbox, flow, secrets=[flag], stem="bad")
    with pytest.raises(heddle.UsageError, match="declared twice"):
        sealed(sandbox, flow, secrets=["KEY=A@a.example.com"], egress_file=egress_file, stem="bad")
    base = manifest.to_json()
    for bad in ({"T": {"env": "X", "hosts": ["a.example.com"]}},
                {"T": {"env": "X", "file": "/x", "header": "A: {}", "hosts": ["a.example.com"]}},
                {"T": {"env": "X", "header": "Authorization: Bearer", "hosts": ["a.example.com"]}}):
        with pytest.raises(MalformedBundleError, match="secrets"):
            Manifest.from_json({**base, "secrets": bad})


def test_an_a2a_agent_gets_its_url_and_is_held_to_it(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("a2a.client")
    from tests.support.a2a_server import served

    with served() as (base, _):
        doc = sandbox / "a2a.json"
        doc.write_text(json.dumps({
            "component_type": "A2AAgent", "id": "remote", "name": "remote", "agent_url": f"{base}/echo/",
            "connection_config": {"component_type": "A2AConnectionConfig", "id": "cc", "name": "cc", "timeout": 30},
            "session_parameters": {"timeout": 30, "poll_interval": 0.02, "max_retries": 2},
            "agentspec_version": "26.1.0"}))
        out = sealed(sandbox, doc, egress=["unrelated=example.com"])
        host = base.split("://", 1)[1]
        assert peek(out).manifest.egress == {"remote": (host,), "unrelated": ("example.com",)}
        proc = heddle_here(capsys, "run", out, "--allow-unsigned", "--message", "hello")
        assert proc.returncode == 0 and json.loads(proc.stdout) == {"result": "echo: hello"}, proc.stderr
        # The same agent held to another host: its request is refused before it is sent.
        from heddle.egress import EgressPolicy

        policy = EgressPolicy({"remote": (Rule("example.com"),)})
        import asyncio

        import httpx

        async def one() -> None:
            async with httpx.AsyncClient(event_hooks={"request": [policy.hook("remote", httpx.ConnectError)]}) as c:
                await c.get(f"{base}/echo/")

        with pytest.raises(httpx.ConnectError, match=f"egress refused: {host.replace('.', '[.]')} is not on"):
            asyncio.run(one())


def test_secrets_without_an_egress_list_are_refused() -> None:
    base = peek(VECTORS / "valid-signed.heddle").manifest.to_json()
    secrets = {"T": {"env": "X", "header": "Authorization: Bearer {}", "hosts": ["a.example.com"]}}
    with pytest.raises(MalformedBundleError, match="secrets: is there without egress"):
        Manifest.from_json({**base, "secrets": secrets})
    assert Manifest.from_json({**base, "secrets": secrets, "egress": {}}).secrets == secrets


def test_a_document_run_takes_egress_and_secrets_as_flags(sandbox: Path, api: str, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    flow = remote_flow(sandbox / "src", api + "/other-port")
    # No flag: as before egress existed (the redirect's port is tried, and nothing listens there).
    proc = heddle_here(capsys, "run", flow)
    assert proc.returncode == 1 and "egress refused" not in proc.stderr
    proc = heddle_here(capsys, "run", flow, "--egress", "other=example.com")
    assert proc.returncode == 1 and "egress refused: 127.0.0.1:9 is not on the egress allow-list of 'fetch'" in \
        proc.stderr
    proc = heddle_here(capsys, "run", flow, "--secret", "TOKEN=SOME_VAR@api.example.com")
    assert proc.returncode == 2 and "SOME_VAR, which is not set" in proc.stderr
    monkeypatch.setenv("SOME_VAR", "v")
    proc = heddle_here(capsys, "run", flow, "--secret", "TOKEN=SOME_VAR@api.example.com")
    assert proc.returncode == 2 and "run it with --safe" in proc.stderr
    # A bundle's list is sealed: a flag cannot widen it.
    out = sealed(sandbox, flow)
    proc = heddle_here(capsys, "run", out, "--allow-unsigned", "--egress", "fetch=evil.example.com")
    assert proc.returncode == 2 and "has its egress list and secrets sealed in it" in proc.stderr


def test_a_server_applies_egress_and_secrets_to_the_documents_requests_send(
        sandbox: Path, api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import httpx

    from heddle.server.app import build_app
    from heddle.server.cli import config_from
    from heddle.server.config import check_config
    from heddle.server.service import Service

    doc = json.loads(remote_flow(sandbox / "src", api + "/other-port").read_text())

    async def post(service: Service) -> httpx.Response:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                return await client.post("/v1/runs", json={"flow": doc})
        finally:
            await service.aclose()

    # As `heddle run` does for a document: nothing declared, no list; anything declared, the whole list.
    local = ["--allow-net", "127.0.0.1"]  # the test's API is on loopback, which request flows may not reach else
    plain = asyncio.run(post(Service(config_from(local, {}))))
    assert "/other-port" in _Api.paths and "egress refused" not in plain.text, plain.text
    held = asyncio.run(post(Service(config_from([*local, "--egress", "other=example.com"], {}))))
    assert "egress refused: 127.0.0.1:9 is not on the egress allow-list of 'fetch'" in held.text, held.text
    # Secrets: refused at start-up when their variable is missing or no tool could use them.
    monkeypatch.delenv("SOME_VAR", raising=False)
    with pytest.raises(heddle.UsageError, match="SOME_VAR, which is not set"):
        Service(config_from(["--secret", "TOKEN=SOME_VAR@api.example.com"], {}))
    monkeypatch.setenv("SOME_VAR", "v")
    with pytest.raises(heddle.UsageError, match="run it with --safe"):
        Service(config_from(["--secret", "TOKEN=SOME_VAR@api.example.com"], {}))
    with pytest.raises(heddle.UsageError, match="--egress 'fetch=no host'"):
        Service(config_from(["--egress", "fetch=no host"], {}))
    # A served bundle's list is sealed in it, as for `heddle run`.
    for flag in (["--egress", "fetch=evil.example.com"], ["--secret", "TOKEN=SOME_VAR@evil.example.com"]):
        with pytest.raises(heddle.UsageError, match=f"{flag[0]} applies to the documents requests send"):
            check_config(config_from(["--bundle", str(sealed(sandbox, remote_flow(sandbox / "b", api))), *flag], {}))
