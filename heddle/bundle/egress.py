"""The egress allow-list a bundle seals: declared (`--egress`, `--egress-file`, the commands file's and the
plugins' `egress:` sections) and, once anything is declared, derived from the document's URLs.

Nothing declared seals no list, and the bundle runs as every bundle did before egress existed. Declaring
anything makes the list complete: each component of the document that reaches the network (a RemoteTool,
an ApiNode, an MCP transport over HTTP, an A2A agent, an llm config) is given the host and port of its URL, widened by
what is declared for its name; one whose URL has no fixed host (a `{{placeholder}}` or `$VAR` in it)
must be declared, or the seal is refused naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.walk import components
from heddle.egress import EgressError, merge, parse_flag, parse_secret_flag, parse_secrets, parse_section, url_rule
from heddle.errors import UsageError
from heddle.safeparse import NotRegularFileError, ParseLimitError, load_yaml, read_regular

if TYPE_CHECKING:
    from heddle.egress import Rule, SecretSpec


def network_components(flow: c.Flow) -> Iterator[tuple[str, str, str]]:
    """(name, url, label) for each component of `flow` that sends requests over the network."""
    seen: set[int] = set()
    for where, item in components(flow):
        kind: str | None = None
        if isinstance(item, c.RemoteTool | c.ApiNode | c.SSETransport | c.StreamableHTTPTransport | c.A2AAgent):
            kind = item.component_type
        elif isinstance(item, c.LlmConfigBase):
            kind = "llm config"
        if kind is None or id(item) in seen:
            continue
        seen.add(id(item))
        url = item.agent_url if isinstance(item, c.A2AAgent) else getattr(item, "url", None)
        yield item.name, url if isinstance(url, str) else "", f"{kind} {item.name!r} at {where}"


def read_egress_file(path: Path) -> tuple[dict[str, tuple[Rule, ...]], dict[str, SecretSpec]]:
    """`--egress-file FILE`: YAML or JSON with the keys `egress` (a mapping of tool name to hosts) and
    `secrets` (a mapping of secret name to its env or file, hosts and header), either or both."""
    import yaml  # only when a file is read: every run of the CLI imports this module

    what = f"--egress-file {path}"
    try:
        value: Any = load_yaml(read_regular(path).decode("utf-8"), aliases=False)
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    except NotRegularFileError as exc:
        raise UsageError(f"{what}: {exc.strerror}") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot be read: {exc.strerror}") from None
    except (ParseLimitError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{what}: is not YAML or JSON: {exc}") from None
    if not isinstance(value, dict) or not value or not set(value) <= {"egress", "secrets"}:
        raise UsageError(f"{what}: must be a mapping with the keys egress and secrets (either or both)")
    try:
        return (parse_section(value.get("egress", {}), f"{what}: egress"),
                parse_secrets(value.get("secrets", {}), f"{what}: secrets"))
    except EgressError as exc:
        raise UsageError(str(exc)) from None


def sealed_egress(flow: c.Flow, declared: Iterable[Mapping[str, Iterable[Rule]]], *, secrets: bool = False
                  ) -> dict[str, tuple[str, ...]] | None:
    """The manifest's `egress` for `flow` and what was declared for it; None when nothing was (a secret
    declared is a declaration: only the proxy of a run with a list hands it on)."""
    lists = [d for d in declared if d]
    if not lists and not secrets:
        return None
    derived: dict[str, set[Rule]] = {}
    given = merge(*lists)
    for name, url, label in network_components(flow):
        rule = url_rule(url)
        if rule is not None:
            derived.setdefault(name, set()).add(rule)
        elif name not in given:
            raise UsageError(f"egress: {label} has no fixed host in its url {url!r}; declare the hosts it may "
                             f"reach with --egress {name}=HOST[:PORT]")
    try:
        merged = merge(given, derived)
    except EgressError as exc:
        raise UsageError(str(exc)) from None
    return {name: tuple(map(str, rules)) for name, rules in merged.items()}


def parse_flags(flags: Iterable[str]) -> dict[str, tuple[Rule, ...]]:
    """`--egress TOOL=HOST[:PORT][,...]`, repeatable; one tool given twice gets both lists."""
    try:
        return merge(*({name: rules} for name, rules in map(parse_flag, flags)))
    except EgressError as exc:
        raise UsageError(str(exc)) from None


def parse_secret_flags(flags: Iterable[str], more: Mapping[str, SecretSpec]) -> dict[str, dict[str, Any]] | None:
    """`--secret NAME=ENV@HOST[,...]` (repeatable) with the secrets of an egress file, as the manifest seals
    them; None when there are none. A name given twice is refused."""
    try:
        given = [parse_secret_flag(text) for text in flags]
    except EgressError as exc:
        raise UsageError(str(exc)) from None
    out: dict[str, SecretSpec] = dict(more)
    for spec in given:
        if spec.name in out:
            raise UsageError(f"--secret {spec.name}: the secret {spec.name} is declared twice; declare it once")
        out[spec.name] = spec
    return {name: out[name].to_json() for name in sorted(out)} or None
