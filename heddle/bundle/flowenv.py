"""A flow's llm configs and the environment: the keys a bundle must not carry, and the
variables a sealed flow reads where it runs.

A model's `api_key` is either a `$VAR` reference, read from the environment when the run is
prepared, or the key itself. A key written into a flow would be sealed into every copy of
the bundle, so sealing refuses it. `heddle doctor` lists the variables the flow reads, so a
machine can be checked before anything runs; values are never read out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from heddle.format.errors import MalformedBundleError, PackError

# The OpenAiConfig default when a config gives no api_key (heddle.model.client.resolve_api_key).
OPENAI_DEFAULT = "OPENAI_API_KEY"
_CHECKED = ("api_key",)  # the fields of an llm config the engine reads from the environment


def llm_config_types() -> frozenset[str]:
    """The component types of an llm config, from the models the engine runs."""
    from heddle.spec.components import LlmConfig

    union = get_args(LlmConfig)[0]
    return frozenset(cls.model_fields["component_type"].default for cls in get_args(union))


def _configs(document: Any, *, skip_metadata: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON path, config) for every llm config in a parsed document, in document order.

    A stack, not recursion: a document from a bundle may nest as deep as it likes; and each
    container once, since YAML aliases (and resolved references) share them."""
    types = llm_config_types()
    stack: list[tuple[str, Any]] = [("$", document)]
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if isinstance(node, (dict, list)):
            if id(node) in seen:
                continue
            seen.add(id(node))
        if isinstance(node, dict):
            if node.get("component_type") in types:
                yield path, node
            stack.extend((f"{path}.{key}", value) for key, value in reversed(node.items())
                         if not (skip_metadata and key == "metadata"))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(node))))


def _label(config: dict[str, Any], path: str) -> str:
    name, ident = config.get("name"), config.get("id")
    shown = repr(name) if isinstance(name, str) and name else "(unnamed)"
    if isinstance(ident, str) and ident and ident != name:
        shown += f" (id {ident!r})"
    return f"llm_config {shown} at {path}"


def env_reference(value: Any) -> str | None:
    """The variable a `$NAME` or `${NAME}` value names, or None if it is not such a reference."""
    from heddle.model.client import _ENV_REF

    match = _ENV_REF.match(value) if isinstance(value, str) else None
    return None if match is None else match.group(1) or match.group(2)


def literal_keys(document: Any) -> list[str]:
    """Each llm config of the (unresolved) document that writes its key in the document:
    every one, used or not, since the document's bytes are what a bundle carries."""
    found = []
    for path, config in _configs(document, skip_metadata=False):
        for key in _CHECKED:
            value = config.get(key)
            if value is not None and value != "" and env_reference(value) is None:
                found.append(f"{_label(config, path)} has a literal {key}")
    return found


def refuse_literal_keys(flow: Path, fmt: str | None = None) -> None:
    """Refuse to seal a flow that carries a model key, naming each llm config that does."""
    from heddle.errors import DocumentError
    from heddle.spec.document import _parse_text, detect_format

    try:
        document = _parse_text(flow.read_text(encoding="utf-8"), detect_format(flow, fmt), str(flow))
    except OSError as exc:
        raise PackError(f"flow {flow}: cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PackError(f"flow {flow}: is not UTF-8 text") from None
    except DocumentError as exc:
        raise PackError(str(exc)) from None
    except RecursionError:
        raise PackError(f"flow {flow}: nests too deeply to be read") from None
    found = literal_keys(document)
    if found:
        raise PackError(
            f"flow {flow}: {'; '.join(found)}, which every copy of the bundle would carry; write "
            "api_key: \"$VAR\" (e.g. \"$OPENAI_API_KEY\") and set VAR where the bundle runs"
        )


@dataclass(frozen=True)
class EnvRead:
    """A variable the flow reads: its name, what reads it, and whether a run needs it set."""

    name: str
    where: str
    required: bool = True


def env_reads(document: Any) -> list[EnvRead]:
    """The variables the llm configs of a parsed flow read, each once, in document order.

    References are resolved first, so a config defined but never used is not listed."""
    from heddle.spec.references import resolve_references

    resolved = resolve_references(document, source="the sealed flow")
    out: dict[str, EnvRead] = {}
    for path, config in _configs(resolved, skip_metadata=True):
        for key in _CHECKED:
            name = env_reference(config.get(key))
            if name is not None:
                out.setdefault(name, EnvRead(name, f"{key} of {_label(config, path)}"))
        if config.get("api_key") is None and config.get("component_type") == "OpenAiConfig":
            out.setdefault(OPENAI_DEFAULT, EnvRead(
                OPENAI_DEFAULT, f"api_key of {_label(config, path)}, which gives none (sent if set)", required=False))
    return list(out.values())


class _Found(Exception):
    """Ends the payload walk once the flow's bytes are read and checked."""


class _Collect:
    def __init__(self, keep: bool, out: bytearray) -> None:
        self._keep, self._out = keep, out

    def write(self, chunk: memoryview) -> None:
        if self._keep:
            self._out += chunk

    def finish(self) -> None:
        if self._keep:
            raise _Found()

    def abort(self) -> None:
        self._out.clear()


def sealed_flow_reads(bundle: Path) -> list[EnvRead]:
    """The variables the flow sealed in `bundle` reads. Nothing is trusted or unpacked: the
    flow's bytes are read from the archive and checked against the manifest's sha256."""
    from heddle.errors import DocumentError
    from heddle.format.archive import read_head
    from heddle.format.limits import DEFAULT_LIMITS
    from heddle.format.verify import open_file, sealed_manifest, walk_payload
    from heddle.spec.document import _parse_text, detect_format

    what = str(bundle)
    data = bytearray()
    with open_file(bundle) as fh:
        head = read_head(fh, what=what, limits=DEFAULT_LIMITS)
        manifest = sealed_manifest(head, what=what, limits=DEFAULT_LIMITS)
        try:
            walk_payload(head.reader, manifest, lambda item: _Collect(item.path == manifest.flow, data), what=what)
        except _Found:
            pass
        else:
            raise MalformedBundleError(f"{what}: the flow {manifest.flow!r} the manifest names is not in the payload")
    flow = manifest.flow
    try:
        return env_reads(_parse_text(bytes(data).decode("utf-8"), detect_format(Path(flow)), f"{what}: {flow}"))
    except UnicodeDecodeError:
        raise MalformedBundleError(f"{what}: the sealed flow {flow} is not UTF-8 text") from None
    except DocumentError as exc:
        raise MalformedBundleError(f"{what}: the sealed flow does not load: {exc}") from None
    except RecursionError:
        raise MalformedBundleError(f"{what}: the sealed flow {flow} nests too deeply") from None
