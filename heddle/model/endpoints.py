"""Where each llm config of a run sends its requests, and with which key: decided once, at run start.

An llm config's `url` is either written in the document or `$VAR`, read from the environment
when the run is prepared (as `api_key: $VAR` is), so one sealed bundle can be pointed at another
endpoint without re-sealing it. `--model-url NAME=URL` replaces one config's URL for one run; NAME
is the config's name or id. Every refusal names the config and what to do, before any node runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from heddle.agentspec.components import GEMINI_API_KEY_VARIABLE, GeminiConfig, env_reference, written_api_key
from heddle.errors import UsageError
from heddle.secret_env import is_secret, secret_read

if TYPE_CHECKING:
    from heddle.agentspec.components import LlmConfig, RetryPolicy

FLAG = "--model-url"


@dataclass(frozen=True)
class ModelEndpoint:
    base_url: str  # as written in the flow; normalised with endpoint_url()
    model_id: str
    api_key: str | None  # already resolved (no "$NAME" here)
    params: dict[str, Any] = field(default_factory=dict)  # default_generation_parameters, passed through
    retry_policy: RetryPolicy | None = None  # the config's own; replaces the client's retries and timeout


def endpoint_url(url: str, *, where: str | None = None) -> str:
    """The base URL requests go under: `/v1` appended when the URL has no path, no trailing slash."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        at = f"{where}: " if where else ""
        raise UsageError(f"{at}model url {url!r} is not an http(s) URL; write it as http://HOST[:PORT][/PATH]")
    path = parts.path.rstrip("/")
    if not path:
        # Local servers are usually written as bare host:port; their API lives under /v1.
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _from_env(value: str, field: str, where: str) -> tuple[str, str | None]:
    """The variable a `$NAME` (or `${NAME}`) value of `field` names, and its value (None: not set)."""
    name = env_reference(value)
    if name is None:
        raise UsageError(f"{where}: {field} {value!r} is not a valid environment variable reference; write it as $NAME")
    if is_secret(name):
        raise UsageError(f"{where}: {secret_read(field, name)}")
    return name, os.environ.get(name)


def resolve_api_key(value: str | None, *, config_type: str, where: str) -> str | None:
    """Turn the flow's `api_key` into the key to send: `$NAME` reads the environment.

    `where` names the llm config in errors and starts the message, e.g. "llm_config 'gpt' of AgentNode 'a'".
    """
    if value is None:
        if config_type == "OpenAiConfig":
            return os.environ.get("OPENAI_API_KEY") or None
        return None
    if not value.startswith("$"):
        return value
    name, key = _from_env(value, "api_key", where)
    if key is None:
        raise UsageError(f"{where}: api_key names environment variable {name}, which is not set;"
                         f" export {name} before running")
    if not key:
        raise UsageError(f"{where}: api_key names environment variable {name}, which is empty;"
                         f" set {name} to the key")
    return key


def resolve_url(value: str, *, where: str) -> str:
    """The config's `url`: as written, or the value of the variable a `$NAME` (or `${NAME}`) names."""
    if not value.startswith("$"):
        return value
    name, url = _from_env(value, "url", where)
    if url is None or not url.strip():
        state = "is not set" if url is None else "is empty"
        raise UsageError(f"{where}: url names environment variable {name}, which {state}; "
                         f"export {name}=http://HOST[:PORT][/PATH] before running")
    endpoint_url(url, where=f"{where} (url from ${name})")
    return url


def parse_model_urls(specs: Iterable[str]) -> dict[str, str]:
    """`NAME=URL` flags as {NAME: URL}; each URL must be an http(s) URL, each NAME given once."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url:
            raise UsageError(f"{FLAG} {spec!r}: give NAME=URL, NAME an llm config's name or id "
                             "(e.g. --model-url gpt=http://127.0.0.1:8000/v1)")
        if name in out:
            raise UsageError(f"{FLAG} {name}: given twice; give each llm config one URL")
        endpoint_url(url, where=f"{FLAG} {name}")
        out[name] = url
    return out


def _label(config: LlmConfig) -> str:
    shown = repr(config.name) if config.name else "(unnamed)"
    return f"{shown} (id {config.id!r})" if config.id and config.id != config.name else shown


def _overrides(configs: Sequence[LlmConfig], model_urls: Mapping[str, str]) -> dict[int, tuple[str, str]]:
    """{id(config): (NAME, URL)} for each config a `--model-url` names; refuses a NAME that names
    none, or two configs that are not the same one."""
    chosen: dict[int, tuple[str, str]] = {}
    for name, url in model_urls.items():
        matched = [cfg for cfg in configs if name in (cfg.name, cfg.id)]
        if not matched:
            known = ", ".join(sorted({_label(cfg) for cfg in configs})) or "none (it calls no model)"
            raise UsageError(f"{FLAG} {name}: the document has no llm config of that name or id; its llm configs "
                             f"are: {known}")
        if len({cfg.id or cfg.name for cfg in matched}) > 1:
            ids = ", ".join(sorted({repr(cfg.id) for cfg in matched}))
            raise UsageError(f"{FLAG} {name}: names several llm configs (ids {ids}); give the id of one")
        for cfg in matched:
            if id(cfg) in chosen and chosen[id(cfg)][0] != name:
                raise UsageError(f"{FLAG} {name} and {FLAG} {chosen[id(cfg)][0]} both name llm config "
                                 f"{_label(cfg)}; give it one URL")
            chosen[id(cfg)] = (name, url)
    return chosen


def flow_endpoints(configs: Sequence[tuple[str, LlmConfig]], model_urls: Mapping[str, str]) -> dict[int, ModelEndpoint]:
    """{id(config): endpoint} for the (label, config) pairs of a flow (heddle.graph.llm_configs)."""
    overrides = _overrides([cfg for _, cfg in configs], model_urls)
    endpoints: dict[int, ModelEndpoint] = {}
    for label, config in configs:
        if id(config) in endpoints:
            continue
        where = f"llm_config {config.name!r} of {label}"
        override = overrides.get(id(config))
        url = override[1] if override is not None else resolve_url(config.url, where=where)
        key = resolve_api_key(written_api_key(config), config_type=config.component_type, where=where)
        model_id = config.model_id
        if isinstance(config, GeminiConfig):
            model_id = config.wire_model_id()
            if config.auth.api_key is None:
                key = os.environ.get(GEMINI_API_KEY_VARIABLE) or None
        endpoints[id(config)] = ModelEndpoint(base_url=url, model_id=model_id, api_key=key,
                                              params=dict(config.default_generation_parameters or {}),
                                              retry_policy=config.retry_policy)
    return endpoints


def describe_overrides(configs: Sequence[tuple[str, LlmConfig]], model_urls: Mapping[str, str]) -> list[str]:
    """One line per llm config a `--model-url` redirects, for `--verbose`."""
    overrides = _overrides([cfg for _, cfg in configs], model_urls)
    lines: dict[int, str] = {}
    for _, config in configs:
        if id(config) in overrides and id(config) not in lines:
            name, url = overrides[id(config)]
            lines[id(config)] = f"llm_config {_label(config)}: {url} ({FLAG} {name}; the document says {config.url})"
    return list(lines.values())
