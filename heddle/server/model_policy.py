"""Which model endpoints a flow may reach from this server, and with which key.

A flow sent in a request is written by the caller, so it may not aim the server at its own
network (loopback, private and link-local addresses; the operator names exceptions with
`--allow-net`), nor read the server's environment (`api_key: $VAR`, or the OpenAI default of
`OPENAI_API_KEY` and Gemini's of `GEMINI_API_KEY`). The one key the server lends is
`HEDDLE_LLM_DEFAULT_KEY`, and only to the endpoint named by `--llm-default-url`.

Names are resolved when the request is checked; a name that resolves differently a moment
later (DNS rebinding) is not caught here. Run request code under `--safe --deny-net` and put
the server where its network holds nothing a caller must not reach.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from heddle.errors import UsageError
from heddle.server.errors import bad_request

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow, LlmConfig
    from heddle.model.client import ModelEndpoint

RESOLVE_TIMEOUT_S = 5.0
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")


def llm_configs(flow: Flow) -> Iterator[tuple[str, LlmConfig]]:
    """(where, llm config) for every model the flow and its subflows call."""
    from heddle.graph import llm_configs as configs_of

    for label, config in configs_of(flow):
        yield f"llm_config {config.name!r} of {label}", config


def check_allow_net(entries: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for entry in entries:
        host = entry.strip().strip("[]").lower()
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOSTNAME.match(host):
                raise UsageError(f"--allow-net {entry!r}: give a host name or an IP address, without scheme "
                                 "or port (e.g. --allow-net 127.0.0.1)") from None
        out.append(host)
    return tuple(out)


def _normalised(url: str) -> str | None:
    from heddle.model.client import endpoint_url

    try:
        return endpoint_url(url).lower()
    except UsageError:
        return None


def _internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


async def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    # an IPv6 address may carry its zone (%eth0); SOCK_STREAM inet answers hold the address as text
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


@dataclass(frozen=True)
class Refusal:
    """A step of a policy plan: the document is refused, whatever the network says."""

    message: str
    type: str


@dataclass(frozen=True)
class Address:
    """A step of a policy plan: the host of `url` must resolve outside this server's network."""

    where: str
    url: str
    what: str = "model url"
    exempt_default: bool = True


PolicyPlan = tuple[Refusal | Address, ...]


@dataclass(frozen=True)
class ModelPolicy:
    allow_net: tuple[str, ...] = ()
    default_url: str | None = None
    default_key: str | None = None

    def _is_default(self, url: str) -> bool:
        return self.default_url is not None and _normalised(url) == _normalised(self.default_url)

    def plan(self, flow: Flow) -> PolicyPlan:
        """What `check` refuses of a request's flow (one that reads server secrets or reaches the server's
        network), in its order: the refusals the document alone
        decides, and the addresses to resolve. A function of the flow, so it can be kept with it; the
        addresses are resolved anew each time the plan is checked."""
        from heddle.agentspec.components import written_api_key

        steps: list[Refusal | Address] = []
        for where, config in llm_configs(flow):
            key = written_api_key(config)
            if isinstance(key, str) and key.startswith("$"):
                return (*steps, Refusal(f"{where}: api_key {key!r} would read this server's environment, which a "
                                        "request may not do; send the key itself, or use the server's default "
                                        "model", "forbidden_key"))
            if config.url.startswith("$"):
                return (*steps, Refusal(f"{where}: url {config.url!r} would read this server's environment, which "
                                        "a request may not do; send the URL itself", "forbidden_url"))
            steps.append(Address(where, config.url))
        if self._plan_mcp(flow, steps) and self._plan_remote_tools(flow, steps):
            self._plan_a2a(flow, steps)
        return tuple(steps)

    async def check(self, plan: PolicyPlan) -> None:
        for step in plan:
            if isinstance(step, Refusal):
                raise bad_request(step.message, step.type)
            await self._check_url(step.where, step.url, step.what, exempt_default=step.exempt_default)

    def _plan_remote_tools(self, flow: Flow, steps: list[Refusal | Address]) -> bool:
        """A request's RemoteTools and ApiNodes: the model URLs' rules for the host each names (its
        placeholders fill only path and query, and its redirects stay on that host), and no header
        read from this server's environment. False once a refusal ends the plan."""
        from heddle.agentspec.components import env_reference
        from heddle.tools.remote import http_requests

        for path, tool in http_requests(flow):
            where = f"{tool.component_type} {tool.name!r} at {path}"
            for name, value in {**tool.headers, **tool.sensitive_headers}.items():
                if isinstance(value, str) and env_reference(value) is not None:
                    steps.append(Refusal(f"{where}: header {name!r} {value!r} would read this server's environment, "
                                         "which a request may not do; send the value itself", "forbidden_key"))
                    return False
            steps.append(Address(where, tool.url, "url", exempt_default=False))
        return True

    def _plan_a2a(self, flow: Flow, steps: list[Refusal | Address]) -> None:
        """A request's A2AAgent: the model URLs' rules for its agent_url, no header read from this
        server's environment and no file of this server's read for its TLS."""
        from heddle.agentspec.components import A2AAgent, env_reference
        from heddle.agentspec.walk import of_type

        for path, agent in of_type(flow, A2AAgent):
            where, config = f"A2AAgent {agent.name!r} at {path}", agent.connection_config
            for name, value in (config.headers or {}).items():
                if env_reference(value) is not None:
                    steps.append(Refusal(f"{where}: header {name!r} {value!r} would read this server's environment, "
                                         "which a request may not do; send the value itself", "forbidden_key"))
                    return
            files = [field for field in ("key_file", "cert_file", "ssl_ca_cert") if getattr(config, field)]
            if files:
                steps.append(Refusal(f"{where}: connection_config {files[0]} names a file of this server, which a "
                                     "flow sent in a request may not read; seal the flow in a bundle the server "
                                     "runs", "forbidden_field"))
                return
            steps.append(Address(where, agent.agent_url, "agent_url", exempt_default=False))

    def _plan_mcp(self, flow: Flow, steps: list[Refusal | Address]) -> bool:
        """MCP servers of a request's flow: never a program started here, and the model URLs' rules.
        False once a refusal ends the plan."""
        from heddle.agentspec.components import StdioTransport, env_reference
        from heddle.tools.mcp import transports_of

        for where, transport in transports_of(flow):
            if isinstance(transport, StdioTransport):
                steps.append(Refusal(f"{where}: a flow sent in a request may not start a program on this server; "
                                     "seal the flow in a bundle the server runs, or use an HTTP MCP server",
                                     "forbidden_field"))
                return False
            headers = {**(transport.headers or {}), **(transport.sensitive_headers or {})}
            for name, value in headers.items():
                if env_reference(value) is not None:
                    steps.append(Refusal(f"{where}: header {name!r} {value!r} would read this server's environment, "
                                         "which a request may not do; send the value itself", "forbidden_key"))
                    return False
            steps.append(Address(where, transport.url, "MCP server url"))
        return True

    async def _check_url(self, where: str, url: str, what: str = "model url", *, exempt_default: bool = True) -> None:
        if exempt_default and self._is_default(url):
            return
        parts = urlsplit(url.strip())
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            host, port = None, None
        if parts.scheme not in ("http", "https") or not host:
            raise bad_request(f"{where}: {what} {url!r} is not an http(s) URL", "invalid_flow")
        host = host.lower()
        if host in self.allow_net:
            return
        port = port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = await _addresses(host, port)
        except (TimeoutError, OSError, UnicodeError, ValueError):
            raise bad_request(f"{where}: {what} {url!r}: host {host!r} does not resolve from this server",
                              "forbidden_url") from None
        inside = [a for a in addresses if _internal(a)]
        if inside:
            raise bad_request(f"{where}: {what} {url!r} points at {inside[0]}, an address of this server's "
                              "own network; the operator can allow it with --allow-net " + host, "forbidden_url")

    def assign_keys(self, flow: Flow, endpoints: dict[int, ModelEndpoint], *, from_request: bool) -> None:
        """Give the default endpoint its key; strip keys a request flow took from the environment."""
        from heddle.agentspec.components import written_api_key

        for _, config in llm_configs(flow):
            endpoint = endpoints.get(id(config))
            if endpoint is None or written_api_key(config) is not None:
                continue
            if self._is_default(endpoint.base_url):  # the URL the run uses: a `$VAR` one is read by now
                endpoints[id(config)] = dataclasses.replace(endpoint, api_key=self.default_key)
            elif from_request and endpoint.api_key is not None:
                endpoints[id(config)] = dataclasses.replace(endpoint, api_key=None)
