"""Egress allow-lists: per tool (or other component that reaches the network), the hosts it may reach.

A rule is `HOST[:PORT]`: an exact name (`api.example.com`), a wildcard of one name's subdomains
(`*.example.com`, which does not admit `example.com` itself), an IPv4 literal or a bracketed IPv6 literal
(`[::1]`). Without a port a rule admits 443 and 80 only, the ports of https and http URLs, so that a
rule written for a web API does not open every service on its host. Names compare without case and
without a trailing dot.

A bundle that declares no egress at all is not restricted (what every bundle sealed before egress
existed does); one that declares any holds a list for every component that reaches the network, and a
component it does not list reaches nothing.

This module imports nothing of heddle's at import time: the format reads sealed lists with it, the
engine enforces them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from heddle.secret_env import is_secret

DEFAULT_PORTS = (443, 80)
MAX_RULES = 256  # of one component
MAX_RULE_CHARS = 260
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
MAX_NAME_CHARS = 128


class EgressError(ValueError):
    """A rule, a list or a `TOOL=HOST` flag that cannot be read; the message names what is wrong."""


def _host(text: str) -> str | None:
    """`text` as a canonical host (lowercase, no trailing dot, IPv6 bracketed), or None when it is none."""
    if text.startswith("[") and text.endswith("]"):
        try:
            return f"[{ipaddress.IPv6Address(text[1:-1]).compressed}]"
        except ValueError:
            return None
    name = text.lower().removesuffix(".")
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    labels = name.split(".")
    if labels[0] == "*":
        labels = labels[1:]
        if len(labels) < 2:
            return None  # `*` and `*.com` would admit too much to be meant
    if not labels or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    return name


@dataclass(frozen=True)
class Rule:
    host: str  # canonical: lowercase, no trailing dot; `*.` for subdomains; IPv6 in brackets
    port: int | None = None  # None: 443 and 80

    @classmethod
    def parse(cls, text: str) -> Rule:
        if not isinstance(text, str) or not text or len(text) > MAX_RULE_CHARS:
            raise EgressError(f"{text!r} is not HOST[:PORT]")
        host, port = text, None
        bracket = text.rfind("]")
        colon = text.rfind(":")
        if colon > bracket and (bracket >= 0 or text.count(":") == 1):
            host, digits = text[:colon], text[colon + 1:]
            if not digits.isdigit() or not digits.isascii() or not 0 < int(digits) < 65536:
                raise EgressError(f"{text!r}: the port must be a number from 1 to 65535")
            port = int(digits)
        canonical = _host(host)
        if canonical is None:
            raise EgressError(f"{text!r} is not HOST[:PORT] (a name, *.name, an IPv4 address or [an IPv6 address])")
        return cls(canonical, port)

    def key(self) -> tuple[str, int]:
        """The order rules are listed in: by host, then port (none first)."""
        return (self.host, self.port or 0)

    def __str__(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"

    def admits(self, host: str, port: int) -> bool:
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        wanted = _host(host if ":" not in host or host.startswith("[") else f"[{host}]")
        if wanted is None:
            return False
        if self.host.startswith("*."):
            return wanted.endswith(self.host[1:])
        return wanted == self.host


def parse_rules(text: str | Iterable[str], where: str) -> tuple[Rule, ...]:
    """`HOST[:PORT][,HOST[:PORT]...]` (or a list of them), sorted and each once."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        rules = sorted({Rule.parse(item.strip() if isinstance(item, str) else item) for item in items}, key=Rule.key)
    except EgressError as exc:
        raise EgressError(f"{where}: {exc}") from None
    if not rules:
        raise EgressError(f"{where}: give at least one HOST[:PORT]")
    if len(rules) > MAX_RULES:
        raise EgressError(f"{where}: {len(rules)} hosts, over the cap of {MAX_RULES}")
    return tuple(rules)


def check_name(name: Any, where: str) -> str:
    if (not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS or "=" in name
            or any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name)):
        raise EgressError(f"{where}: {name!r} is not the name of a tool or component (1 to {MAX_NAME_CHARS} "
                          "characters, no '=' and no control character)")
    return name


def parse_flag(text: str) -> tuple[str, tuple[Rule, ...]]:
    """`--egress TOOL=HOST[:PORT][,...]`."""
    name, sep, hosts = text.partition("=")
    if not sep:
        raise EgressError(f"--egress {text!r}: give TOOL=HOST[:PORT][,HOST[:PORT]...]")
    return check_name(name.strip(), f"--egress {text!r}"), parse_rules(hosts, f"--egress {text!r}")


def parse_section(value: Any, where: str) -> dict[str, tuple[Rule, ...]]:
    """An `egress:` section: a mapping of tool name to a list of `HOST[:PORT]` (or one such string)."""
    if not isinstance(value, dict):
        raise EgressError(f"{where} must be a mapping of tool name to a list of HOST[:PORT]")
    out: dict[str, tuple[Rule, ...]] = {}
    for name, hosts in value.items():
        at = f"{where}.{name}"
        check_name(name, at)
        if not isinstance(hosts, str | list) or (isinstance(hosts, list) and
                                                 not all(isinstance(h, str) for h in hosts)):
            raise EgressError(f"{at} must be a list of HOST[:PORT] strings")
        out[name] = parse_rules(hosts, at)
    return out


def merge(*lists: Mapping[str, Iterable[Rule]]) -> dict[str, tuple[Rule, ...]]:
    """The union of `lists`, per name."""
    out: dict[str, set[Rule]] = {}
    for one in lists:
        for name, rules in one.items():
            out.setdefault(name, set()).update(rules)
    merged = {name: tuple(sorted(rules, key=Rule.key)) for name, rules in sorted(out.items())}
    for name, rules in merged.items():
        if len(rules) > MAX_RULES:
            raise EgressError(f"egress of {name!r}: {len(rules)} hosts, over the cap of {MAX_RULES}")
    return merged


def url_rule(url: str) -> Rule | None:
    """The rule that admits `url`'s host and port; None when it has no fixed one (a `{{placeholder}}`
    or `$VAR` in its scheme or host, or no http(s) URL at all)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or "{" in parts.netloc or "$" in parts.netloc:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    try:
        return Rule.parse(f"{host}:{port or (443 if parts.scheme == 'https' else 80)}")
    except EgressError:
        return None


@dataclass(frozen=True)
class EgressPolicy:
    """A run's allow-lists, by component name."""

    lists: Mapping[str, tuple[Rule, ...]]

    @classmethod
    def sealed(cls, lists: Mapping[str, Iterable[str]]) -> EgressPolicy:
        """The policy of a manifest's `egress` (rules it checked when it was read)."""
        return cls({name: tuple(map(Rule.parse, rules)) for name, rules in lists.items()})

    def problem(self, name: str, host: str, port: int) -> str | None:
        """Why `name` may not reach `host:port`, or None when it may."""
        rules = self.lists.get(name, ())
        if any(rule.admits(host, port) for rule in rules):
            return None
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        listed = ", ".join(map(str, rules)) if rules else "no host"
        return (f"egress refused: {shown}:{port} is not on the egress allow-list of {name!r} (it lists {listed}); "
                f"seal the bundle with --egress {name}={shown}:{port} to let it")

    def url_problem(self, name: str, url: str) -> str | None:
        """Why `name` may not send requests to `url` (an http(s) URL), or None when it may."""
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(url.strip())
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return f"egress refused: {url!r} is not a URL with a host and port"
        return self.problem(name, parts.hostname or "", port)

    def hook(self, name: str, error: type[Exception]) -> Any:
        """An httpx request hook (called for every request and redirect hop a client sends) that refuses a
        request to a host not on `name`'s list with `error(message)`: the client's own transport error, so
        the call fails as one to an unreachable host does, naming the host and the component."""

        async def check(request: Any) -> None:
            url = request.url
            port = url.port or (443 if url.scheme == "https" else 80)
            problem = self.problem(name, url.host, port)
            if problem is not None:
                raise error(problem)

        return check


# --------------------------------------------------------------------------- secrets

DEFAULT_HEADER = "Authorization: Bearer {}"
MAX_SECRETS = 64
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
# A query parameter's name: the characters a URL carries unencoded, so that it is found as written.
_QUERY_NAME = re.compile(r"[A-Za-z0-9._~-]{1,64}")
# What a secret's name may not be: the variables every sandboxed tool is given by heddle.
_RESERVED = frozenset({"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "TERM", "HEDDLE_WORKSPACE",
                       "HEDDLE_WORKSPACE_BIN", "TRACEPARENT", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                       "https_proxy", "all_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                       "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE"})


@dataclass(frozen=True)
class SecretSpec:
    """A secret a tool may use without holding it: the tool's `$name` is a placeholder, which heddle's
    egress proxy replaces by the value (read from `env` or `file` when the run starts; never sealed) in
    requests to `hosts` alone: in the `header`, or, with `query`, as the value of that query parameter."""

    name: str
    hosts: tuple[Rule, ...]
    env: str | None = None
    file: str | None = None
    header: str = DEFAULT_HEADER
    query: str | None = None  # a query parameter's name: the secret goes there, and in no header

    @property
    def header_name(self) -> str:
        return self.header.split(":", 1)[0]

    def header_line(self, secret: str) -> str:
        """The header line with `secret` (a value or a placeholder) in its place."""
        name, _, template = self.header.partition(":")
        return f"{name}: {template.strip().replace('{}', secret)}"

    @property
    def placement(self) -> str:
        """Where the value goes, as messages say it."""
        return f"the query parameter {self.query!r}" if self.query is not None else repr(self.header)

    def to_json(self) -> dict[str, Any]:
        source = {"env": self.env} if self.env is not None else {"file": self.file}
        where = {"query": self.query} if self.query is not None else {"header": self.header}
        return {**source, **where, "hosts": [str(r) for r in self.hosts]}


def _secret_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _ENV.fullmatch(name):
        raise EgressError(f"{where}: {name!r} is not an environment variable name (the tool reads the placeholder "
                          "as $NAME)")
    if name in _RESERVED or is_secret(name):
        raise EgressError(f"{where}: {name} is a variable heddle sets or keeps for itself; name the secret otherwise")
    return name


def _header(value: Any, where: str) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise EgressError(f"{where}: {value!r} is not a header template such as {DEFAULT_HEADER!r}")
    name, _, template = value.partition(":")
    if (not _HEADER_NAME.fullmatch(name) or template.count("{}") != 1 or len(value) > 256
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)):
        raise EgressError(f"{where}: {value!r} is not a header template: a header name, ':', and a value holding "
                          "{} once (where the secret goes)")
    return f"{name}: {template.strip()}"


def parse_secret_flag(text: str) -> SecretSpec:
    """`--secret NAME=ENV@HOST[:PORT][,HOST[:PORT]...]`."""
    where = f"--secret {text!r}"
    name, sep, rest = text.partition("=")
    env, at, hosts = rest.partition("@")
    if not sep or not at:
        raise EgressError(f"{where}: give NAME=ENV@HOST[:PORT][,HOST[:PORT]...]")
    if not _ENV.fullmatch(env):
        raise EgressError(f"{where}: {env!r} is not an environment variable name")
    return SecretSpec(_secret_name(name, where), parse_rules(hosts, where), env=env)


def parse_secret(name: str, value: Any, where: str) -> SecretSpec:
    """One entry of a `secrets:` section (or of a manifest's): `env` or `file`, `hosts`, and where the value
    goes: `header` (default DEFAULT_HEADER) or `query`, a query parameter's name."""
    _secret_name(name, where)
    if not isinstance(value, dict) or not set(value) <= {"env", "file", "hosts", "header", "query"} or \
            len({"env", "file"} & set(value)) != 1 or "hosts" not in value or {"header", "query"} <= set(value):
        raise EgressError(f"{where} must be a mapping with env or file (one of them), hosts, and optionally header "
                          "or query (not both)")
    query = value.get("query")
    if query is not None and (not isinstance(query, str) or not _QUERY_NAME.fullmatch(query)):
        raise EgressError(f"{where}.query: {query!r} is not a query parameter's name (1 to 64 letters, digits and "
                          "._~-)")
    env, file = value.get("env"), value.get("file")
    if env is not None and (not isinstance(env, str) or not _ENV.fullmatch(env)):
        raise EgressError(f"{where}.env: {env!r} is not an environment variable name")
    if file is not None and (not isinstance(file, str) or not file.startswith("/") or len(file) > 4096
                             or any(ord(c) < 0x20 for c in file)):
        raise EgressError(f"{where}.file: {file!r} is not an absolute path")
    hosts = value["hosts"]
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise EgressError(f"{where}.hosts must be a list of HOST[:PORT]")
    return SecretSpec(name, parse_rules(hosts, f"{where}.hosts"), env=env, file=file,
                      header=_header(value.get("header", DEFAULT_HEADER), f"{where}.header"), query=query)


def parse_secrets(value: Any, where: str) -> dict[str, SecretSpec]:
    """A `secrets:` section: a mapping of NAME to its entry."""
    if not isinstance(value, dict):
        raise EgressError(f"{where} must be a mapping of secret name to env or file, hosts and header")
    if len(value) > MAX_SECRETS:
        raise EgressError(f"{where}: {len(value)} secrets, over the cap of {MAX_SECRETS}")
    return {name: parse_secret(name, item, f"{where}.{name}") for name, item in value.items()}


MAX_SECRET_BYTES = 64 * 1024


@dataclass(frozen=True)
class Secrets:
    """A run's secrets with their values, read when it starts; held by heddle's egress proxy alone."""

    specs: tuple[SecretSpec, ...]
    values: Mapping[str, str] = field(repr=False, default_factory=dict)

    @classmethod
    def read(cls, sealed: Mapping[str, Any], environ: Mapping[str, str]) -> Secrets:
        """The secrets a manifest declares, each value read from its variable or file now; EgressError naming
        the secret and its source when one is missing, empty, too long or holds a control character."""
        specs = tuple(parse_secret(name, item, f"secrets.{name}") for name, item in sorted(sealed.items()))
        values: dict[str, str] = {}
        for spec in specs:
            if spec.env is not None:
                source = f"environment variable {spec.env}"
                value = environ.get(spec.env)
                if not value:
                    raise EgressError(f"secret {spec.name} comes from {source}, which "
                                      f"{'is not set' if value is None else 'is empty'}; export {spec.env} before "
                                      "running")
            else:
                source = f"file {spec.file}"
                try:
                    with open(str(spec.file), "rb") as fh:
                        data = fh.read(MAX_SECRET_BYTES + 1)
                except OSError as exc:
                    raise EgressError(f"secret {spec.name} comes from {source}, which cannot be read: "
                                      f"{exc.strerror}") from None
                if len(data) > MAX_SECRET_BYTES:
                    raise EgressError(f"secret {spec.name}: {source} is over {MAX_SECRET_BYTES} bytes")
                value = data.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
                if not value:
                    raise EgressError(f"secret {spec.name}: {source} is empty")
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
                raise EgressError(f"secret {spec.name}: the value in {source} holds a control character, which no "
                                  "header or URL may")
            values[spec.name] = value
        return cls(specs, values)
