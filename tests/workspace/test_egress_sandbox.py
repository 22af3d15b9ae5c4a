"""Under --safe with an egress allow-list, a tool reaches the network through heddle's proxy alone.

One tool makes every attempt (each a way around a proxy set by environment variables) and reports
each outcome; the allowed requests reach a server the test starts on loopback, by a name the test
maps and by its listed address, and every refused one is reported as an `egress_refused` event.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.settings import RunSettings
from heddle.workspace.sandbox import find_bwrap
from tests.support.flows import FlowDoc, server_tool

pytestmark = pytest.mark.skipif(find_bwrap() is None or shutil.which("curl") is None
                                or not os.access("/usr/bin/python3", os.X_OK),
                                reason="needs bubblewrap, curl and /usr/bin/python3")

TOOL = r'''#!/usr/bin/python3
import json, os, socket, subprocess, sys, urllib.request

def attempt(op):
    kind, arg = op[0], op[1]
    try:
        if kind == "get":  # an HTTP client that honours the proxy variables
            with urllib.request.urlopen(arg, timeout=10) as r:
                return [True, r.read().decode()]
        if kind == "curl":
            done = subprocess.run(["/usr/bin/curl", "-sS", "--max-time", "10", *arg], capture_output=True, text=True,
                                  env=op[2] if len(op) > 2 else None)
            return [done.returncode == 0, done.stdout + done.stderr]
        if kind == "tcp":
            with socket.create_connection((arg[0], arg[1]), timeout=3) as s:
                return [True, "connected"]
        if kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2)
            query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
            s.sendto(query, (arg, 53))
            return [True, repr(s.recv(512))]
        if kind == "sh":
            done = subprocess.run(["/bin/sh", "-c", arg], capture_output=True, text=True)
            return [done.returncode == 0, done.stdout + done.stderr]
        if kind == "dns":
            return [True, socket.gethostbyname(arg)]
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX)
            s.connect(arg)
            return [True, "connected"]
        if kind == "proc":
            return [True, open(arg, errors="replace").read()]
        if kind == "env":
            return [True, os.environ.get(arg, "")]
        if kind == "grep":  # whether a text is in any file under a folder, or in /proc/self
            hits = []
            for top in arg[1]:
                for root, _, files in os.walk(top):
                    for name in files:
                        try:
                            with open(os.path.join(root, name), "rb") as fh:
                                if arg[0].encode() in fh.read(1 << 20):
                                    hits.append(os.path.join(root, name))
                        except OSError:
                            pass
            for name in ("environ", "cmdline"):
                if arg[0].encode() in open(f"/proc/self/{name}", "rb").read():
                    hits.append(name)
            return [not hits, hits]
    except Exception as exc:
        return [False, f"{type(exc).__name__}: {exc}"]

ops = json.load(sys.stdin)["ops"]
json.dump({"report": json.dumps([attempt(op) for op in json.loads(ops)])}, sys.stdout)
'''


SECRET = "s3cr3t-value-4f1d2c9e"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client the proxy cut off mid-request (a refused body) is expected here


class _Api(BaseHTTPRequestHandler):
    port = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.do_GET()

    def do_GET(self) -> None:
        if self.path in ("/auth", "/echo"):
            got = self.headers.get("authorization") or ""
            text = (f"echo {got}" if self.path == "/echo" else "authorized" if got == f"Bearer {SECRET}"
                    else f"denied ({len(got)} characters)")
            data = text.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("location", f"http://unlisted.test:{self.port}/ok")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        data = b"hello from the listed host"
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _Api)
    _Api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _Api.port
    server.shutdown()
    server.server_close()


def run_tool(tmp_path: Path, ops: list[list[Any]], egress: dict[str, tuple[str, ...]] | None,
             secrets: dict[str, Any] | None = None, **settings: Any) -> tuple[list[list[Any]], list[ev.Event]]:
    from heddle.engine.options import with_egress
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow

    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "net").write_text(TOOL)
    (tools / "net").chmod(0o755)
    f = FlowDoc("egress-sandbox")
    s = f.start(["ops"])
    t = f.tool_node("net", server_tool("net", ["ops"], ["report"]))
    e = f.end(["report"])
    f.control(s, t)
    f.control(t, e)
    flow = f.write(tmp_path / "flow.json")
    options = with_egress(RunSettings(**{"safe": True, "tool_timeout": 120, **settings}).run_options(), egress,
                          secrets)
    prepared = prepare_run(load_flow(flow), tools={"net": tools / "net"}, tools_dir=tools, options=options)
    events: list[ev.Event] = []
    state = asyncio.run(run_prepared(prepared, {"ops": json.dumps(ops)}, on_event=events.append)).state
    return json.loads(state["report"]), events


def test_the_proxy_is_the_only_way_out(tmp_path: Path, api: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.workspace import egress_proxy

    monkeypatch.setitem(egress_proxy.HOSTS, "api.test", "127.0.0.1")
    # A Unix socket and an abstract socket of the host, listening.
    short = Path("/tmp") / f"heddle-egress-test-{uuid.uuid4().hex[:8]}.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(short))
    unix.listen(1)
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0heddle-egress-test-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    abstract.listen(1)
    listed = f"http://api.test:{api}"
    ops: list[list[Any]] = [
        ["get", f"{listed}/ok"],                                       # 0 allowed, by the mapped name
        ["curl", [f"http://127.0.0.1:{api}/ok"]],                      # 1 allowed, by the listed address
        ["curl", ["--proxytunnel", f"{listed}/ok"]],                   # 2 allowed, through CONNECT
        ["tcp", ["127.0.0.1", api]],                                   # 3 raw TCP to the IP literal
        ["tcp", ["1.1.1.1", 80]],                                      # 4 raw TCP outside
        ["curl", ["--noproxy", "*", f"http://127.0.0.1:{api}/ok"]],    # 5 the variables ignored
        ["udp", "8.8.8.8"],                                            # 6 UDP/DNS to an outside resolver
        ["dns", "example.com"],                                        # 7 the sandbox's own resolver
        ["tcp", ["2606:4700:4700::1111", 80]],                         # 8 an IPv6 literal
        ["unix", str(short)],                                          # 9 a Unix socket of the host
        ["unix", abstract_name],                                       # 10 an abstract socket of the host
        ["proc", "/proc/net/tcp"],                                     # 11 the host's connections
        ["get", f"http://localhost:{api}/ok"],                         # 12 a listed name, a loopback address
        ["get", f"{listed}/redirect"],                                 # 13 redirected to an unlisted host
        ["curl", ["--proxytunnel", "http://api.test:1/"]],            # 14 CONNECT to an unlisted port
        ["curl", [f"http://127.0.0.1:{api}/ok"], {}],                  # 15 a child that clears its environment
        ["get", "http://elsewhere.test/ok"],                           # 16 an unlisted host
    ]
    try:
        results, events = run_tool(tmp_path, ops, {"net": (f"127.0.0.1:{api}", f"api.test:{api}",
                                                           f"localhost:{api}")})
    finally:
        unix.close()
        abstract.close()
        short.unlink()
    for i in (0, 1, 2):
        assert results[i][0] and "hello from the listed host" in results[i][1], (i, results[i])
    for i in (3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16):
        assert not results[i][0], (i, ops[i], results[i])
    # The sandbox's /proc/net is its own namespace's: the server's listening port is not in it.
    assert results[11][0] and f":{api:04X}" not in results[11][1]
    refused = [(e.tool, e.host, e.port, e.reason) for e in events if isinstance(e, ev.EgressRefused)]
    assert ("net", "localhost", api) in [r[:3] for r in refused]
    assert any(r[1] == "localhost" and "not a public address" in r[3] for r in refused)
    assert ("net", "unlisted.test", api) in [r[:3] for r in refused]
    assert ("net", "api.test", 1) in [r[:3] for r in refused]
    assert any(r[1] == "elsewhere.test" and "not on the egress allow-list of 'net'" in r[3] for r in refused)
    # Nothing of the proxy is left behind.
    assert not [p for p in os.listdir("/tmp") if p.startswith("heddle-egress-") and not p.endswith(".sock")]


def test_without_a_list_safe_mode_is_unchanged(tmp_path: Path, api: int) -> None:
    # No list declared: the tool shares the machine's network, as under --safe before egress.
    results, _ = run_tool(tmp_path, [["tcp", ["127.0.0.1", api]]], None)
    assert results[0][0], results
    # A list that does not name the tool: it reaches nothing, through the proxy or not.
    results, events = run_tool(tmp_path, [["get", f"http://127.0.0.1:{api}/ok"], ["tcp", ["127.0.0.1", api]]],
                               {"other": ("example.com",)})
    assert not results[0][0] and not results[1][0]
    assert [(e.tool, e.host) for e in events if isinstance(e, ev.EgressRefused)] == [("net", "127.0.0.1")]


def _tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """An HTTPS server on loopback with a certificate for api.test from an authority of the test's own,
    which the proxy (alone) is told to trust."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from heddle.workspace import egress_proxy

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test authority")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "api.test")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("api.test")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    monkeypatch.setattr(egress_proxy, "UPSTREAM_CAFILES", [str(tmp_path / "ca.pem")])
    server = _Server(("127.0.0.1", 0), _Api)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "server.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    yield from _tls_server(tmp_path, monkeypatch)


def test_a_secret_reaches_its_hosts_and_never_the_tool(tmp_path: Path, api: int, tls_api: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.workspace import egress_proxy

    monkeypatch.setitem(egress_proxy.HOSTS, "api.test", "127.0.0.1")
    monkeypatch.setenv("HEDDLE_TEST_SECRET_SOURCE", SECRET)
    secure, plain, other = f"https://api.test:{tls_api}", f"http://127.0.0.1:{api}", f"http://api.test:{api}"
    ops: list[list[Any]] = [
        ["env", "TOKEN"],                                                               # 0 a placeholder
        ["grep", [SECRET, ["/tmp", os.getcwd()]]],                                      # 1 no secret bytes
        ["curl", ["-H", "PLACEHOLDER", f"{secure}/auth"]],                              # 2 HTTPS, declared host
        ["curl", ["-H", "PLACEHOLDER", f"{plain}/auth"]],                               # 3 HTTP, declared host
        ["curl", ["-H", "PLACEHOLDER", f"{other}/auth"]],                               # 4 a host not declared
        ["curl", ["-H", "X-Key: $TOKEN", f"{plain}/auth"]],                             # 5 another header
        ["curl", ["-H", "PLACEHOLDER", "--data", "t=$TOKEN", f"{plain}/auth"]],         # 6 in the body
        ["curl", ["-H", "PLACEHOLDER", f"{secure}/echo"]],                              # 7 a server that echoes it
    ]
    egress = {"net": (f"127.0.0.1:{api}", f"api.test:{api}", f"api.test:{tls_api}")}
    sealed = {"TOKEN": {"env": "HEDDLE_TEST_SECRET_SOURCE", "header": "Authorization: Bearer {}",
                        "hosts": sorted([f"api.test:{tls_api}", f"127.0.0.1:{api}"])}}
    results, events = run_tool(tmp_path, _with_token(ops), egress, secrets=sealed)
    assert results[0][1].startswith("heddle-placeholder-TOKEN-") and SECRET not in results[0][1]
    assert results[1][0], results[1]
    assert results[2] == [True, "authorized"] and results[3] == [True, "authorized"], results
    for i in (4, 5, 6):
        assert "403" in results[i][1] or "heddle egress" in results[i][1], (i, results[i])
        assert "authorized" not in results[i][1]
    assert results[7][0] and SECRET not in json.dumps(results) and "[secret TOKEN redacted]" in results[7][1]
    reasons = [e.reason for e in events if isinstance(e, ev.EgressRefused)]
    assert any("on its way to api.test" in r and "not one of its hosts" in r for r in reasons), reasons
    assert any("sent in 'X-Key'" in r for r in reasons) and any("in the body" in r for r in reasons)
    assert any(isinstance(e, ev.Warning) and "secret TOKEN" in e.message and "redacted" in e.message
               for e in events)


def _with_token(ops: list[list[Any]]) -> list[list[Any]]:
    """Curl ops run through sh, so that $TOKEN is the tool's own variable."""
    import shlex

    out: list[list[Any]] = []
    for op in ops:
        if op[0] != "curl":
            out.append(op)
            continue
        words = " ".join('"Authorization: Bearer $TOKEN"' if a == "PLACEHOLDER" else
                         f'"{a}"' if "$TOKEN" in a else shlex.quote(a) for a in op[1])
        out.append(["sh", f"/usr/bin/curl -sS --max-time 10 {words}"])
    return out


def test_secrets_need_safe_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.errors import UsageError

    monkeypatch.setenv("HEDDLE_TEST_SECRET_SOURCE", SECRET)
    sealed = {"TOKEN": {"env": "HEDDLE_TEST_SECRET_SOURCE", "header": "Authorization: Bearer {}",
                        "hosts": ["api.example.com"]}}
    with pytest.raises(UsageError, match="run it with --safe"):
        run_tool(tmp_path, [], {"net": ("api.example.com",)}, secrets=sealed, safe=False)
    with pytest.raises(UsageError, match="--allow-env HEDDLE_TEST_SECRET_SOURCE"):
        run_tool(tmp_path, [], {"net": ("api.example.com",)}, secrets=sealed,
                 allow_env=("HEDDLE_TEST_SECRET_SOURCE",))
    monkeypatch.delenv("HEDDLE_TEST_SECRET_SOURCE")
    with pytest.raises(UsageError, match="secret TOKEN comes from environment variable HEDDLE_TEST_SECRET_SOURCE, "
                                         "which is not set"):
        run_tool(tmp_path, [], {"net": ("api.example.com",)}, secrets=sealed)


def test_required_isolation_is_had_or_the_run_refused(tmp_path: Path, api: int, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.errors import UsageError
    from heddle.workspace import sandbox

    ops = [["tcp", ["127.0.0.1", api]]]
    with pytest.raises(UsageError, match="--require-isolation netns: this run's tools would share the machine's "
                                         "network"):
        run_tool(tmp_path, ops, None, require_isolation="netns")
    with pytest.raises(UsageError, match="not under --safe"):
        run_tool(tmp_path, ops, None, require_isolation="sandbox", safe=False)
    with pytest.raises(UsageError, match="unknown; give one of none, sandbox, netns"):
        run_tool(tmp_path, ops, None, require_isolation="vm")
    # Had: the call's network is its own.
    results, _ = run_tool(tmp_path, ops, {"net": ("example.com",)}, require_isolation="netns")
    assert not results[0][0]
    results, _ = run_tool(tmp_path, ops, None, require_isolation="netns", deny_net=True)
    assert not results[0][0]
    # Where bubblewrap cannot make a network namespace, the run is refused, naming it.
    real = sandbox._bwrap_works
    monkeypatch.setattr(sandbox, "_bwrap_works",
                        lambda bwrap, *extra: "setting up uid map: Permission denied" if extra else real(bwrap))
    with pytest.raises(UsageError, match="--require-isolation netns: no network namespace per call: setting up uid"):
        run_tool(tmp_path, ops, {"net": ("example.com",)}, require_isolation="netns")
    monkeypatch.undo()
    from tests.bundle.conftest import VECTORS
    from tests.support.cli_inproc_proc import heddle_here

    shown = heddle_here(capsys, "doctor", VECTORS / "valid-signed.heddle").stdout
    assert "ok      iso  netns: a network namespace per tool call" in shown
    assert "absent  iso  seccomp" in shown
