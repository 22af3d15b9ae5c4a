"""Every place a document reads the environment where it runs (`$NAME` or `${NAME}`): an llm
config's `api_key` and `url`, the `headers` and `sensitive_headers` of a RemoteTool, an ApiNode and of
an MCP server reached over HTTP, the `headers` of an A2AConnectionConfig, and the `user`, `password`
and `sslkey` of a TlsPostgresDatabaseConnectionConfig. Nothing else in a
document is read from the environment: a `$NAME` anywhere else is text.

A read of one of heddle's own secrets (heddle.secret_env) is refused with the document, before
anything runs or is sealed: the value would go to whatever host the document names.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from heddle.agentspec import components as c
from heddle.agentspec.walk import document_components
from heddle.secret_env import is_secret, secret_read


def _label(component: c.Component, path: str) -> str:
    kind = "llm_config" if isinstance(component, c.LlmConfigBase) else type(component).__name__
    return f"{kind} {component.name!r} at {path}"


def env_reads(root: BaseModel) -> Iterator[tuple[str, str, str]]:
    """(component and its path, field, variable) for each value of the document read from the
    environment, in document order."""
    for path, component in document_components(root):
        fields: list[tuple[str, object]] = []
        if isinstance(component, c.LlmConfigBase):
            fields = [("api_key", c.written_api_key(component)), ("url", getattr(component, "url", None))]
        elif isinstance(component, (c.RemoteTool, c.ApiNode, c.SSETransport, c.StreamableHTTPTransport,
                                    c.A2AConnectionConfig)):
            for kind in ("headers", "sensitive_headers"):
                written = getattr(component, kind, None) or {}  # an A2AConnectionConfig has headers only
                fields += [(f"{kind} {name!r}", value) for name, value in written.items()]
        elif isinstance(component, c.TlsPostgresDatabaseConnectionConfig):
            fields = [(name, getattr(component, name)) for name in ("user", "password", "sslkey")]
        for field, value in fields:
            variable = c.env_reference(value) if isinstance(value, str) else None
            if variable is not None:
                yield _label(component, path), field, variable


def secret_reads(root: BaseModel) -> list[str]:
    """One problem for each value of the document that reads one of heddle's own secrets."""
    return [f"{where}: {secret_read(field, variable)}" for where, field, variable in env_reads(root)
            if is_secret(variable)]
