"""What keeps a web page out: every request must name this server, come from no page or an
allowed one, and send its body as JSON.

A server on 127.0.0.1 is still reachable from the browser of whoever runs it. A page cannot read
the answer of a cross-site request, but it can send one: a `text/plain` form post needs no
preflight, and a DNS name the attacker re-points at 127.0.0.1 makes the page same-origin. So,
for every route and whatever else the server allows:

- `Host` must be a name of this server (421 otherwise): defeats DNS rebinding, where the page's
  own name is sent as the Host. The port is not compared: proxies and port mappings change it,
  and a rebinding page cannot choose the name that reaches us.
- `Origin`, which browsers send on every cross-site request and every POST, must be one of
  `--cors-origin` (403 otherwise); allowed origins get CORS answers and preflights.
- A POST body must be `application/json` (415 otherwise): the only kinds a page may send
  without a preflight are form and text types.

These run as plain ASGI middleware, outside authentication and the routes, so a refused request
reaches no code of the core.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from heddle.server.errors import error_body

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
JSON_TYPE = "application/json"


async def send_error(send: Send, status: int, type_: str, message: str,
                     headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer with the server's usual error body, before any route has seen the request."""
    body = json.dumps(error_body(type_, message), ensure_ascii=False).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            text: str = value.decode("latin-1")
            return text
    return None


def host_name(value: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]`, `[v6]:port`), lowercased; None if malformed."""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit()):
        return None
    name = name.lower()
    # "localhost." is the same name as "localhost" (a fully qualified spelling).
    return name[:-1] if name.endswith(".") and len(name) > 1 else name


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def normal_origin(origin: str) -> str:
    """An origin as browsers serialize it: lowercase, no trailing slash."""
    return origin.strip().rstrip("/").lower()


@dataclass(frozen=True)
class HostRule:
    """Which Host names reach this server, from --host and --allowed-host."""

    bound: str
    allowed: frozenset[str] = frozenset()

    @classmethod
    def of(cls, host: str, allowed_hosts: Iterable[str]) -> HostRule:
        return cls(bound=host.strip("[]").lower(), allowed=frozenset(h.strip("[]").lower() for h in allowed_hosts))

    @property
    def any_name(self) -> bool:
        return "*" in self.allowed

    def accepts(self, name: str) -> bool:
        if self.any_name or name in self.allowed or name in LOOPBACK_NAMES or name == self.bound:
            return True
        ip = _ip(name)
        if ip is None:
            return False
        # An IP literal cannot be re-pointed by DNS; on a wildcard address, any of ours may be asked
        # (Kubernetes probes send the pod's IP).
        return ip.is_loopback or self.bound in WILDCARD_HOSTS


class RequestGuard:
    """Refuse a Host that does not name this server (421) and an Origin not allowed (403)."""

    def __init__(self, app: ASGIApp, hosts: HostRule, origins: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts
        self.origins = origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_host = _header(scope, b"host")
        name = host_name(raw_host) if raw_host is not None else None
        if name is None or not self.hosts.accepts(name):
            given = "no Host header" if raw_host is None else f"Host {raw_host!r}"
            await send_error(send, 421, "misdirected_request",
                             f"{given} does not name this server; use localhost, its address, or a name its "
                             "operator allows with --allowed-host NAME (--allowed-host * behind a proxy)")
            return
        origin = _header(scope, b"origin")
        if origin is not None and "*" not in self.origins and normal_origin(origin) not in self.origins:
            await send_error(send, 403, "origin_not_allowed",
                             f"Origin {origin!r} may not call this server; its operator can allow that page "
                             f"with --cors-origin {origin}")
            return
        await self.app(scope, receive, send)


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or (length is not None and length.strip() != "0")


def json_media_type_problem(value: str) -> str | None:
    """Why a Content-Type is not JSON in UTF-8, or None when it is."""
    media, *params = value.split(";")
    if media.strip().lower() != JSON_TYPE:
        return f"Content-Type {value!r}: send the body as {JSON_TYPE}"
    for param in params:
        key, _, raw = param.partition("=")
        if key.strip().lower() != "charset" or raw.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return f"Content-Type {value!r}: a JSON body is read as UTF-8; send {JSON_TYPE} (charset=utf-8 at most)"
    return None


class JsonBodyOnly:
    """POST bodies of `paths` must be `application/json` (415 otherwise); a bodiless POST may omit it."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            content_type = _header(scope, b"content-type")
            if content_type is None:
                problem = (f"a request body needs Content-Type: {JSON_TYPE}" if _has_body(scope) else None)
            else:
                problem = json_media_type_problem(content_type)
            if problem is not None:
                # The body is left unread: the connection closes after this answer.
                await send_error(send, 415, "unsupported_media_type", problem, [(b"connection", b"close")])
                return
        await self.app(scope, receive, send)


def guard_middleware(*, host: str, allowed_hosts: Iterable[str], cors_origins: Iterable[str],
                     body_paths: Iterable[str], auth: list[Middleware]) -> list[Middleware]:
    """The app's middleware, outermost first: names and origins, CORS for allowed pages,
    authentication, then the body's media type (so an allowed page can read its 415)."""
    origins = frozenset(normal_origin(o) for o in cors_origins)
    stack = [Middleware(RequestGuard, hosts=HostRule.of(host, allowed_hosts), origins=origins)]
    if origins:
        from starlette.middleware.cors import CORSMiddleware

        # The operator named these pages, so a public one may reach a loopback server too
        # (Private Network Access preflights).
        stack.append(Middleware(CORSMiddleware, allow_origins=sorted(origins), allow_methods=["GET", "POST"],
                                allow_headers=["Authorization", "Content-Type"], expose_headers=["Retry-After"],
                                allow_private_network=True, max_age=600))
    stack += auth
    stack.append(Middleware(JsonBodyOnly, paths=frozenset(body_paths)))
    return stack
