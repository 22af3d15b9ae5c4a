"""Under `--safe`, a bundle's egress allow-list enforced on its tools' processes.

A tool call whose run has an allow-list gets a network namespace of its own (bubblewrap's
`--unshare-net`): it holds a loopback interface and no route out. The one thing listening in it is on
127.0.0.1:PROXY_PORT, and heddle serves its HTTP proxy (`guarded`) there, in its own process, for that one
call. For a tool call that listener is made in the sandbox's namespace before the tool starts and handed
to heddle's event loop, which accepts on it directly: no process of the call's own carries its traffic
(EgressCall.runner, heddle.tools.spawner.OwnNetwork). Where the kernel does not allow that, and for the
processes heddle keeps for a run (an MCP server over stdio, a plugin: `process_guard`, one proxy per
process), RELAY, run by the system's python3 before the program, listens there and forwards each
connection to the proxy's Unix socket, bind-mounted into the sandbox. The tool's
`HTTP_PROXY`/`HTTPS_PROXY` name that address, so clients that honour them work unchanged; a client that
ignores them, raw TCP or UDP, DNS, an IPv6 literal, a host's Unix or abstract socket reach nothing,
because nothing else is there.

The proxy takes `CONNECT host:port` and plain `http://` requests. It checks the host and port
against the calling tool's list, resolves the name itself and connects to the address it checked (a
second resolution could answer otherwise), and refuses an address that is not global (private,
loopback, link-local, ...) unless the rule that admitted it is that very IP literal. Every refusal is
answered 403 and reported as an `egress_refused` event naming the tool, the host and the reason.

With secrets (heddle.egress.Secrets), the tool's `$NAME` is a placeholder made for the call; the proxy
reads every request (ending each tunnel's TLS with an authority made for the call, which the tool
trusts through CA_VARIABLES) and puts the value in place of the placeholder in the secret's header (or
its query parameter) of a request to one of its hosts, refusing a placeholder anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import shutil
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.engine.events import EgressRefused
from heddle.errors import UsageError

if TYPE_CHECKING:
    from heddle.egress import EgressPolicy, Secrets, SecretSpec
    from heddle.engine.events import Event
    from heddle.engine.options import RunOptions
    from heddle.tools.spawner import OwnNetwork

PROXY_PORT = 3128
SANDBOX_SOCKET = "/tmp/.heddle-egress.sock"
PYTHON = "/usr/bin/python3"
MAX_HEAD = 16 * 1024  # bytes of a proxy request's head
HEAD_TIMEOUT = 10.0  # seconds to send it
CONNECT_TIMEOUT = 15.0
_CHUNK = 64 * 1024

# Run by the sandbox's python3 as `python3 -I -S -c RELAY SOCKET PORT PROGRAM ARGS...`: listens first
# (so the tool's first connection waits in the backlog), forks the relay, and becomes the tool.
RELAY = r"""
import os, socket, sys, threading
path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
if os.fork() == 0:
    os.setsid()
    def pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    def serve(conn):
        up = socket.socket(socket.AF_UNIX)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            return
        threading.Thread(target=pump, args=(conn, up), daemon=True).start()
        pump(up, conn)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
listener.close()
os.execvp(argv[0], argv)
"""


def proxy_env() -> dict[str, str]:
    """The variables that send a tool's HTTP clients to the relay."""
    url = f"http://127.0.0.1:{PROXY_PORT}"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "ALL_PROXY": url, "all_proxy": url}


def relay_argv() -> list[str]:
    """What runs before the tool's own argv inside the sandbox."""
    return [PYTHON, "-I", "-S", "-c", RELAY, SANDBOX_SOCKET, str(PROXY_PORT)]


def runner_problem() -> str | None:
    """None when a tool call's sandbox can be given its network namespace with heddle's listener in it here
    (heddle.tools.spawner.OwnNetwork); else why not. Asked once per process."""
    from heddle.tools.spawner import own_network_problem

    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not here"
    return own_network_problem(PROXY_PORT, (bwrap, "--unshare-user", "--unshare-pid", "--unshare-net",
                                            "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
                                            "--dev", "/dev", "--cap-drop", "ALL", "--", "true"))


def check_relay() -> None:
    """Refused before a run starts when a tool call under an allow-list could not reach the proxy here: its
    listener is made in its namespace where the kernel allows it (asked now, once per process), else RELAY
    runs in the sandbox, as for MCP servers' and plugins' processes."""
    if runner_problem() is None:
        return
    if not os.access(PYTHON, os.X_OK):
        raise UsageError(f"--safe with an egress allow-list runs a relay with {PYTHON} inside each tool's sandbox, "
                         "and it is not there; install python3")


@dataclass(frozen=True)
class Refusal:
    tool: str
    host: str
    port: int
    reason: str


Report = Callable[[Refusal], None]

# Names answered ahead of DNS, as a hosts file would: empty in every run; tests put a name of their
# own here to reach a server on loopback by it. No flag, setting or variable fills it.
HOSTS: dict[str, str] = {}


def _pinned(policy: EgressPolicy, tool: str, host: str, port: int) -> bool:
    """Whether the rule admitting `host:port` is an IP literal (which may then be any address)."""
    for rule in policy.lists.get(tool, ()):
        literal = rule.host.strip("[]")
        try:
            ipaddress.ip_address(literal)
        except ValueError:
            continue
        if rule.admits(host, port):
            return True
    return False


class _Refused(Exception):
    """A request the proxy will not pass on: answered 403 and reported."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(reason)
        self.host, self.port, self.reason = host, port, reason


@dataclass(frozen=True)
class _Placeholder:
    spec: SecretSpec
    text: str  # what the tool holds in the secret's stead
    value: str = field(repr=False)


class _Proxy:
    def __init__(self, policy: EgressPolicy, tool: str, report: Report, hosts: Mapping[str, str],
                 placeholders: tuple[_Placeholder, ...] = (), authority: _Authority | None = None) -> None:
        self.policy, self.tool, self.report, self.hosts = policy, tool, report, hosts
        self.placeholders, self.authority = placeholders, authority
        self.window = max((len(p.text) for p in placeholders), default=0)

    def refusal(self, refused: _Refused) -> bytes:
        self.report(Refusal(self.tool, refused.host, refused.port, refused.reason))
        body = f"heddle egress: {refused.reason}\n".encode()
        return (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def address(self, host: str, port: int) -> str:
        """The address to connect to; _Refused when the list or the address rule says no."""
        problem = self.policy.problem(self.tool, host, port)
        if problem is not None:
            raise _Refused(host, port, problem)
        pinned = _pinned(self.policy, self.tool, host, port)
        literal = host.strip("[]")
        try:
            ipaddress.ip_address(literal)
            addresses = [literal]
        except ValueError:
            if host.lower() in self.hosts:
                addresses, pinned = [self.hosts[host.lower()]], True
            else:
                loop = asyncio.get_running_loop()
                try:
                    infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                                   CONNECT_TIMEOUT)
                except (OSError, TimeoutError) as exc:
                    raise _Refused(host, port, f"{host} does not resolve: {exc}") from None
                addresses = [str(info[4][0]) for info in infos]
        for address in addresses:
            ip = ipaddress.ip_address(address)
            if ip.is_global or pinned:
                return address
        raise _Refused(host, port, f"{host} resolves to {addresses[0]}, which is not a public address (a private, "
                                   "loopback or link-local one); list that address itself to let it")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: list[asyncio.StreamWriter] = []
        try:
            await self._serve(reader, writer, upstream)
        except _Refused as refused:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(self.refusal(refused))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                ssl.SSLError):
            pass
        finally:
            for w in (*upstream, writer):
                with contextlib.suppress(OSError, RuntimeError):
                    w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     upstream: list[asyncio.StreamWriter]) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        method, target, _ = _request_line(head)
        if method == "CONNECT":
            host, sep, digits = target.rpartition(":")
            if not sep or not digits.isdigit() or not host:
                raise ValueError("not host:port")
            port = int(digits)
            found = await self.address(host, port)
            tls = self.authority is not None  # with secrets, every tunnel is opened to be read
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
                found, port, ssl=_upstream_context() if tls else None, server_hostname=host.strip("[]") if tls
                else None), CONNECT_TIMEOUT)
            upstream.append(up_writer)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            if self.authority is None:
                await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
                return
            await writer.start_tls(self.authority.context(host.strip("[]")))
            await asyncio.gather(self._requests(reader, writer, up_writer, host, port, None),
                                 _pump(up_reader, writer))
            return
        from urllib.parse import urlsplit

        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            raise _Refused(url.hostname or target[:200], 0, f"{target[:200]!r} is not an http:// URL; https goes "
                                                            "through CONNECT")
        host = url.hostname if ":" not in url.hostname else f"[{url.hostname}]"
        port = url.port or 80
        found = await self.address(host, port)
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(found, port), CONNECT_TIMEOUT)
        upstream.append(up_writer)
        await asyncio.gather(self._requests(reader, writer, up_writer, host, port, head), _pump(up_reader, writer))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        up: asyncio.StreamWriter, host: str, port: int, first: bytes | None) -> None:
        """The requests of one connection, each head checked (and a secret put in it) before it goes on; a
        plain-HTTP proxy request (`first`) is the connection's only one."""
        head = first
        try:
            while True:
                if head is None:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError:
                        return
                checked, length, chunked = self.head(head, host, port, proxied=first is not None)
                up.write(checked)
                await self.body(reader, up, host, port, length, chunked)
                await up.drain()
                if first is not None:
                    return
                head = None
        except _Refused as refused:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(self.refusal(refused))
                await writer.drain()
            up.close()
            writer.close()

    def head(self, head: bytes, host: str, port: int, *, proxied: bool) -> tuple[bytes, int, bool]:
        """A request head as it goes on: its placeholders checked and replaced, a proxy request's target
        made a path; with the length of its body and whether that is chunked."""
        text = head.decode("latin-1")
        lines = text[:-4].split("\r\n")
        method, target, version = _request_line(head)
        target = self.target(target, host, port)
        if proxied:
            from urllib.parse import urlsplit

            url = urlsplit(target)
            target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        out = [f"{method} {target} {version}"]
        length, chunked, sized = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            if proxied and key in ("proxy-connection", "proxy-authorization", "connection", "keep-alive"):
                continue
            if key == "content-length":
                # One length, a plain number: two readings of a body's end are how requests are smuggled.
                if sized or not value.strip().isdigit():
                    raise ValueError("a Content-Length given twice, or not a number")
                length, sized = int(value.strip()), True
            elif key == "transfer-encoding":
                chunked = value.strip().lower() != "identity"
            for p in self.placeholders:
                if p.text not in line:
                    continue
                self.admitted(p, host, port)
                if p.spec.query is not None or key != p.spec.header_name.lower() or \
                        value.strip() != p.spec.header_line(p.text).split(":", 1)[1].strip():
                    raise _Refused(host, port, f"the placeholder of secret {p.spec.name} is sent in {name.strip()!r}"
                                               f"; it is replaced only as {p.spec.placement}")
                line = p.spec.header_line(p.value)
            out.append(line)
        if chunked and sized:
            raise ValueError("both Content-Length and Transfer-Encoding")
        if proxied:
            out.append("Connection: close")
        return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1"), length, chunked

    @staticmethod
    def admitted(p: _Placeholder, host: str, port: int) -> None:
        """_Refused unless `host:port` is one of the hosts `p`'s secret may be sent to."""
        if not any(rule.admits(host, port) for rule in p.spec.hosts):
            raise _Refused(host, port, f"the placeholder of secret {p.spec.name} is on its way to {host}:{port}, "
                                       f"which is not one of its hosts ({', '.join(map(str, p.spec.hosts))})")

    def target(self, target: str, host: str, port: int) -> str:
        """A request's target with each placeholder it holds replaced: only a secret placed in a query parameter,
        as that parameter's whole value, in a request to one of its hosts."""
        from urllib.parse import quote

        for p in self.placeholders:
            if p.text not in target:
                continue
            self.admitted(p, host, port)
            path, _, query = target.partition("?")
            pairs = query.split("&")
            wanted = f"{p.spec.query}={p.text}"
            if p.spec.query is None or p.text in path or any(p.text in pair and pair != wanted for pair in pairs):
                raise _Refused(host, port, f"the placeholder of secret {p.spec.name} is in the URL of a request to "
                                           f"{host}:{port}; it is replaced only as {p.spec.placement}")
            given = f"{p.spec.query}={quote(p.value, safe='')}"
            target = f"{path}?{'&'.join(given if pair == wanted else pair for pair in pairs)}"
        return target

    async def body(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, host: str, port: int,
                   length: int, chunked: bool) -> None:
        """A request's body passed on, refused where it holds a placeholder (a secret goes in a header)."""
        tail = b""
        if not chunked:
            tail = await self.copy(reader, up, length, tail, host, port)
            return
        while True:
            line = await reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            up.write(line)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    up.write(trailer)
                up.write(b"\r\n")
                return
            tail = await self.copy(reader, up, size + 2, tail, host, port)

    async def copy(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, size: int, tail: bytes, host: str,
                   port: int) -> bytes:
        while size > 0:
            data = await reader.readexactly(min(size, _CHUNK))
            size -= len(data)
            seen = tail + data
            for p in self.placeholders:
                if p.text.encode() in seen:
                    raise _Refused(host, port, f"the placeholder of secret {p.spec.name} is in the body of a request "
                                               f"to {host}:{port}; it is replaced only as {p.spec.placement}")
            up.write(data)
            await up.drain()
            tail = seen[-self.window:] if self.window else b""
        return tail


def _request_line(head: bytes) -> tuple[str, str, str]:
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("not an HTTP/1 request")
    return parts[0], parts[1], parts[2]


# Certificate files an upstream's certificate may also be checked against, besides the system's: empty in
# every run; tests put the authority of their own TLS server here. No flag, setting or variable fills it.
UPSTREAM_CAFILES: list[str] = []


def _upstream_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    for cafile in UPSTREAM_CAFILES:
        context.load_verify_locations(cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context


class _Authority:
    """One call's certificate authority: the tool trusts it (SANDBOX_CA), the proxy signs with it the
    certificate of each host the tool opens a tunnel to. Its key is never written; each host's key is
    written to the call's private folder only long enough for `ssl` to load it."""

    def __init__(self, folder: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "heddle egress proxy, one tool call")])
        now = datetime.datetime.now(datetime.UTC)
        public = self.key.public_key()
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name).public_key(public)
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False, encipher_only=False,
                                                  decipher_only=False), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
                     .sign(self.key, hashes.SHA256()))
        self.contexts: dict[str, ssl.SSLContext] = {}

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.cert.public_bytes(serialization.Encoding.PEM)

    def context(self, host: str) -> ssl.SSLContext:
        """The server side of a tunnel to `host`, with a certificate for it."""
        if host in self.contexts:
            return self.contexts[host]
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(self.name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        path = os.path.join(self.folder, f"host-{len(self.contexts)}.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(path)
        finally:
            os.unlink(path)
        context.set_alpn_protocols(["http/1.1"])
        self.contexts[host] = context
        return context


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()


SANDBOX_CA = "/tmp/.heddle-egress-ca.pem"
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE")


@dataclass(frozen=True)
class EgressCall:
    """What one sandboxed call is given to reach the network: the proxy's socket (or, `runner`, its
    listener), and the certificate of its authority (a host path, bound at SANDBOX_CA) when it has
    secrets; and what its environment gains: the proxy variables, each secret's placeholder, and the
    variables that trust the authority."""

    socket: str
    env: Mapping[str, str]
    ca_file: str | None = None
    # A tool call's: the listener made in its sandbox's namespace goes to the proxy (run_process's `netns`),
    # and the sandbox runs no relay. None when RELAY forwards to `socket` instead.
    runner: OwnNetwork | None = None


@contextlib.asynccontextmanager
async def guarded(policy: EgressPolicy, tool: str, report: Report, secrets: Secrets | None = None,
                  hosts: Mapping[str, str] | None = None, *, runner: bool = False) -> AsyncIterator[EgressCall]:
    """The host side of one call's proxy, served until the call ends. `hosts` maps names to addresses
    ahead of DNS (with HOSTS; for tests, as no setting reaches either). `runner`: the call is run by
    heddle.tools.process with the EgressCall's `runner`, whose listener the proxy then accepts on."""
    import secrets as random

    from heddle.tools.spawner import OwnNetwork

    with_secrets = secrets is not None and bool(secrets.specs)
    # A folder of the call's own for the relay's socket and the authority's files; a call given its listener
    # without secrets needs none (and is spared making and removing it, a millisecond on some file systems).
    folder = tempfile.mkdtemp(prefix="heddle-egress-") if with_secrets or not runner else None
    try:
        path = os.path.join(folder, "proxy.sock") if folder is not None and not runner else ""
        env = proxy_env()
        placeholders: tuple[_Placeholder, ...] = ()
        authority = None
        ca_file = None
        if secrets is not None and folder is not None and with_secrets:
            placeholders = tuple(_Placeholder(spec, f"heddle-placeholder-{spec.name}-{random.token_hex(16)}",
                                              secrets.values[spec.name]) for spec in secrets.specs)
            env.update({p.spec.name: p.text for p in placeholders})
            authority = _Authority(folder)
            ca_file = os.path.join(folder, "authority.pem")
            # A certificate of a few hundred bytes, in a folder of this call's own: no wait worth a thread.
            with open(ca_file, "wb") as fh:  # noqa: ASYNC230
                fh.write(authority.pem())
            env.update(dict.fromkeys(CA_VARIABLES, SANDBOX_CA))
        proxy = _Proxy(policy, tool, report, {k.lower(): v for k, v in {**HOSTS, **(hosts or {})}.items()},
                       placeholders, authority)
        servers: list[asyncio.Server] = []

        async def adopt(listener: socket.socket) -> None:
            try:
                servers.append(await asyncio.start_server(proxy.serve, sock=listener, limit=MAX_HEAD))
            except BaseException:
                listener.close()
                raise

        if not runner:
            servers.append(await asyncio.start_unix_server(proxy.serve, path=path, limit=MAX_HEAD))
        try:
            yield EgressCall(path, env, ca_file, OwnNetwork(PROXY_PORT, adopt) if runner else None)
        finally:
            for server in servers:
                server.close()
            for server in servers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 1.0)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def call_guard(options: RunOptions, tool: str, emit: Callable[[Event], None], *, runner: bool = False
               ) -> contextlib.AbstractAsyncContextManager[EgressCall | None]:
    """The egress proxy of one sandboxed call of `tool`, or None when the run has no allow-list, is not
    under --safe, or gives tools no network at all (--deny-net). `runner`: the caller runs the call with
    heddle.tools.process.run_process(netns=EgressCall.runner), which hands the proxy the listener of the
    call's namespace where it can (else RELAY runs in the sandbox, as for a process started otherwise)."""
    policy = options.egress
    if policy is None or not options.sandbox.safe or options.sandbox.deny_net:
        return contextlib.nullcontext()
    if runner:
        runner = runner_problem() is None

    def report(refusal: Refusal) -> None:
        emit(EgressRefused(message=f"tool {refusal.tool!r}: {refusal.reason}", tool=refusal.tool,
                           host=refusal.host, port=refusal.port, reason=refusal.reason))

    return guarded(policy, tool, report, options.secrets, runner=runner)


def process_guard(options: RunOptions, name: str, names: Iterable[str]
                  ) -> Callable[[], contextlib.AbstractAsyncContextManager[EgressCall]] | None:
    """The egress proxy of a process heddle starts for a run and keeps (a plugin's): it reaches what any of
    `names` (the plugin's own entry and its tools') may, and its refusals are reported as `name`'s. None where
    call_guard gives a tool call none. The process may serve runs after the one that started it, so its
    refusals are logged (logger heddle.egress, a warning each) rather than emitted as one run's events."""
    policy = options.egress
    if policy is None or not options.sandbox.safe or options.sandbox.deny_net:
        return None
    import logging

    from heddle.egress import EgressPolicy, Rule

    rules = tuple(sorted({rule for n in names for rule in policy.lists.get(n, ())}, key=Rule.key))
    own = EgressPolicy({name: rules})
    log = logging.getLogger("heddle.egress")

    def report(refusal: Refusal) -> None:
        log.warning("egress refused: process %r: %s", refusal.tool, refusal.reason)

    return lambda: guarded(own, name, report, options.secrets)


def check_secrets(options: RunOptions) -> None:
    """Refused before a run starts: secrets that no tool could use as declared."""
    secrets = options.secrets
    if secrets is None or not secrets.specs:
        return
    names = ", ".join(spec.name for spec in secrets.specs)
    if not options.sandbox.safe:
        raise UsageError(f"the secrets {names} (the bundle's, or --secret) reach the tools only through the egress "
                         "proxy of --safe; run it with --safe")
    if options.sandbox.deny_net:
        raise UsageError(f"the secrets {names} (the bundle's, or --secret) need the network, and --deny-net gives "
                         "the tools none; drop --deny-net")
    for spec in secrets.specs:
        if spec.env is not None and spec.env in options.sandbox.allow_env:
            raise UsageError(f"--allow-env {spec.env}: the value of secret {spec.name}, which a tool never holds; "
                             "drop it (the tool's ${spec.name} is a placeholder the proxy replaces)")


def redact(output: Any, secrets: Secrets | None) -> tuple[Any, list[str]]:
    """`output` (a tool's JSON result) with every secret value in its text replaced, and the names of the
    secrets found."""
    if secrets is None or not secrets.values:
        return output, []
    import json
    from urllib.parse import quote

    text = json.dumps(output, ensure_ascii=False)
    # As sent, and as a URL carries it (a query parameter's value, which a server may echo back).
    forms = {name: {value, quote(value, safe="")} for name, value in secrets.values.items()}
    found = [name for name, values in forms.items()
             if any(value in text or json.dumps(value)[1:-1] in text for value in values)]
    if not found:
        return output, []

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            for name in found:
                for form in sorted(forms[name], key=len, reverse=True):
                    value = value.replace(form, f"[secret {name} redacted]")
            return value
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {clean(key): clean(item) for key, item in value.items()}
        return value

    return clean(output), found
