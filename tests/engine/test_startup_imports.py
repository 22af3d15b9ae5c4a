"""What a command loads is what it uses: both shells' `--help` no pydantic, nor the modules that use the flag
table's defaults (the OCI artifact, the sessions' leases) or what those load (hashing, sockets, secrets); a
document's `heddle run` of typed tools, given no commands file, no jsonschema, no bundle verifier or format, no
sessions, no commands' modules, no agent loop, and no search for pydantic plugins through every installed
distribution's metadata; a model at http:// no certificate store; and the garbage collector, paused while a command
starts, is on again when its body runs (heddle.cli.resume_collector). Checked by what is imported,
built and set, never timed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from heddle.lazytls import LazyTLSTransport
from heddle.model.client import ModelClient, ModelEndpoint
from tests.support.cli import env_with
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.threaded_model import threaded_model

_CHECK = """
import atexit, json, sys
from heddle.cli.errors import run_app
from heddle.cli.root import app
from heddle.server.cli import run as serve
found = {}
assert run_app(app, ["run", "--help"]) == 0 and serve(["--help"]) == 0
found["--help"] = sorted(m for m in ("pydantic", "jsonschema", "httpx", "heddle.oci.artifact", "heddle.sessions.lease",
                                     "hashlib", "socket", "secrets") if m in sys.modules)
def report():
    found["run"] = sorted(m for m in ("jsonschema", "httpx", "typer._adapters", "opentelemetry",
                                      "heddle.bundle.verified", "heddle.format.verify", "heddle.format.manifest",
                                      "heddle.sessions.turn", "heddle.sessions.store", "heddle.tools.commands",
                                      "heddle.engine.agent", "importlib.metadata")
                          if m in sys.modules)
    print(json.dumps(found))
atexit.register(report)
sys.argv = ["heddle", "run", sys.argv[1], "--tools-dir", sys.argv[2], "--input", '{"n": 1}']
from heddle.cli import main
main()
"""


def _one_typed_tool(tmp_path: Path) -> Path:
    """A flow of one ToolNode whose tool takes an `integer`; its tool in tmp_path/tools."""
    n = [{"title": "n", "type": "integer"}]
    write_tool(tmp_path / "tools", "one.py", "out = {'one': args['n'] + 1}")
    f = FlowDoc("typed")
    s, node, e = f.start(n), f.tool_node("one", server_tool("one", n)), f.end(["one"])
    f.control(s, node)
    f.control(node, e)
    return f.write(tmp_path / "flow.json")


def test_a_command_imports_only_what_it_uses(tmp_path: Path) -> None:
    flow = _one_typed_tool(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(flow), str(tmp_path / "tools")], capture_output=True,
                          text=True, timeout=60, check=False, env=env_with())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert json.loads(lines[-2]) == {"one": 2, "n": 1}
    assert json.loads(lines[-1]) == {"--help": [], "run": []}


def test_a_model_at_http_needs_no_certificates() -> None:
    async def ask(url: str) -> LazyTLSTransport:
        client = ModelClient(stream=False, retries=0)
        try:
            turn = await client.chat(ModelEndpoint(url, "scripted", None), [{"role": "user", "content": "hi"}])
            assert turn.content == "hi"
            transport = client._http._transport
            assert isinstance(transport, LazyTLSTransport)
            return transport
        finally:
            await client.aclose()

    with threaded_model([{"content": "hi"}]) as model:
        transport = asyncio.run(ask(model.url))
    assert transport._plain is not None and transport._tls is None
    # An https:// request gets the transport httpx.AsyncClient() would have made: certificates loaded, verified.
    tls = LazyTLSTransport()._transport("https")
    context = tls._pool._ssl_context
    assert context is not None and context.check_hostname and context.cert_store_stats()["x509_ca"] > 0


_HEDDLE = """
import atexit, gc, sys
atexit.register(lambda: sys.stderr.write(f"collector: {gc.isenabled()} {gc.get_freeze_count() > 0}\\n"))
sys.argv = ["heddle", *sys.argv[1:]]
from heddle.cli import main
main()
"""


def test_the_collector_is_on_when_a_command_runs(tmp_path: Path) -> None:
    flow = _one_typed_tool(tmp_path)
    for args in (["run", str(flow), "-t", str(tmp_path / "tools"), "--input", '{"n": 1}'],
                 ["validate", str(flow), "-t", str(tmp_path / "tools")]):
        proc = subprocess.run([sys.executable, "-c", _HEDDLE, *args], capture_output=True, text=True, timeout=60,
                              check=False, env=env_with())
        assert proc.returncode == 0, proc.stderr
        assert "collector: True True" in proc.stderr, (args, proc.stderr)
