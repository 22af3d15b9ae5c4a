"""A flow's llm configs and the environment: the keys a bundle must not carry, and the
variables a sealed flow reads where it runs.

A model's `api_key` is either a `$VAR` reference, read from the environment when the run is
prepared, or the key itself. A key written into a flow would be sealed into every copy of
the bundle, so sealing refuses it. A model's `url` may be a `$VAR` too, so a sealed flow can be
pointed at another endpoint where it runs. `heddle doctor` lists the variables the flow reads, so
a machine can be checked before anything runs; values are never read out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from heddle.agentspec.components import LlmConfig, env_reference
from heddle.agentspec.document import _parse_text, detect_format, parse_components
from heddle.agentspec.fields import components_of, containers_of
from heddle.agentspec.references import REF, REFS, resolve_references
from heddle.errors import DocumentError
from heddle.format.archive import read_head
from heddle.format.errors import MalformedBundleError, PackError
from heddle.format.limits import DEFAULT_LIMITS
from heddle.format.verify import open_file, sealed_manifest, walk_payload

# The OpenAiConfig default when a config gives no api_key (heddle.model.client.resolve_api_key).
OPENAI_DEFAULT = "OPENAI_API_KEY"
# A GeminiConfig's key is its auth's (a GeminiAIStudioAuthConfig, checked as a config is), else this.
GEMINI_AUTH = "GeminiAIStudioAuthConfig"
GEMINI_DEFAULT = "GEMINI_API_KEY"
_CHECKED = ("api_key",)  # the fields of an llm config that must not be written into a sealed flow
_FROM_ENV = ("api_key", "url")  # the fields of an llm config the engine reads from the environment


def llm_config_types() -> frozenset[str]:
    """The component types of an llm config, from the models the engine runs."""
    union = get_args(LlmConfig)[0]
    return frozenset(cls.model_fields["component_type"].default for cls in get_args(union)) | {GEMINI_AUTH}


def _configs(document: Any, *, skip_metadata: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON path, config) for every llm config in a parsed document, in document order."""
    types = llm_config_types()
    return ((path, node) for path, node in components_of(document, skip_metadata=skip_metadata)
            if node.get("component_type") in types)


def _label(config: dict[str, Any], path: str) -> str:
    name, ident = config.get("name"), config.get("id")
    shown = repr(name) if isinstance(name, str) and name else "(unnamed)"
    if isinstance(ident, str) and ident and ident != name:
        shown += f" (id {ident!r})"
    return f"llm_config {shown} at {path}"


def _literal(value: Any) -> bool:
    return value is not None and value != "" and not (isinstance(value, str) and env_reference(value))


def _reference(value: Any) -> str | None:
    """The id a `{"$component_ref": ID}` value names (as pyagentspec exports a sensitive field, its
    value given apart from the document), else None."""
    ref = value.get(REF) if isinstance(value, dict) and set(value) == {REF} else None
    return ref if isinstance(ref, str) else None


def _tables(document: Any, where: str) -> dict[str, tuple[str, Any]]:
    """{id: (where it is written, value)} for every `$referenced_components` entry of a parsed document,
    the first in document order where an id is written twice (the outermost table is first)."""
    found: dict[str, tuple[str, Any]] = {}
    for path, node in containers_of(document, skip_metadata=False):
        table = node.get(REFS) if isinstance(node, dict) else None
        if isinstance(table, dict):
            for ref, target in table.items():
                found.setdefault(str(ref), (f"{where}{path}.{REFS}.{ref}", target))
    return found


def literal_keys(document: Any, shared: Any = None, *, shared_source: str = "--components") -> list[str]:
    """Each llm config of the (unresolved) document that writes its key in the document:
    every one, used or not, since the document's bytes are what a bundle carries. A key given by
    `$component_ref` is a reference, not a key: what it names is checked where it is written (in
    the document's `$referenced_components`, or those of `shared`, the parsed components file),
    as is any entry of those tables pyagentspec names as an api_key (`ID.api_key`)."""
    tables = {**(_tables(shared, f"{shared_source} ") if shared is not None else {}), **_tables(document, "")}
    found = []
    named: set[str] = set()
    for path, config in _configs(document, skip_metadata=False):
        for key in _CHECKED:
            value = config.get(key)
            ref = _reference(value)
            if ref is None:
                if _literal(value):
                    found.append(f"{_label(config, path)} has a literal {key}")
                continue
            named.add(ref)
            where, target = tables.get(ref, ("", None))
            if isinstance(target, str) and _literal(target):
                found.append(f"{_label(config, path)} has a literal {key}, given by $component_ref {ref!r} at {where}")
    for ref, (where, target) in tables.items():
        if ref not in named and ref.endswith(".api_key") and isinstance(target, str) and _literal(target):
            found.append(f"$referenced_components entry {ref!r} at {where} is a literal api_key")
    return found


def refuse_literal_keys(flow: Path, fmt: str | None = None, *, what: str = "flow",
                        components: Path | None = None) -> None:
    """Refuse to seal a flow (or its components file) that carries a model key, naming each llm config that does.
    `components`, the flow's components file, is where a key the flow gives by `$component_ref` may be."""
    def parse(path: Path, fmt: str | None, what: str) -> Any:
        try:
            return _parse_text(path.read_text(encoding="utf-8"), detect_format(path, fmt), str(path))
        except OSError as exc:
            raise PackError(f"{what} {path}: cannot be read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise PackError(f"{what} {path}: is not UTF-8 text") from None
        except DocumentError as exc:
            raise PackError(str(exc)) from None
        except RecursionError:
            raise PackError(f"{what} {path}: nests too deeply to be read") from None

    document = parse(flow, fmt, what)
    shared = parse(components, None, "--components") if components is not None else None
    found = literal_keys(document, shared, shared_source=f"--components {components}")
    if found:
        raise PackError(
            f"{what} {flow}: {'; '.join(found)}, which every copy of the bundle would carry; write "
            "api_key: \"$VAR\" (e.g. \"$OPENAI_API_KEY\") and set VAR where the bundle runs"
        )


@dataclass(frozen=True)
class EnvRead:
    """A variable the flow reads: its name, what reads it, and whether a run needs it set."""

    name: str
    where: str
    required: bool = True


def env_reads(document: Any, components: Any = None) -> list[EnvRead]:
    """The variables the llm configs of a parsed flow read, each once, in document order.

    References are resolved first (against the parsed components file too, when there is one),
    so a config defined but never used is not listed."""
    # Here, not at the top: sealing imports this module to refuse literal keys, and these two bring
    # the engine and the HTTP client, which a seal never uses.
    from heddle.engine.pgcache import postgres_env_reads
    from heddle.tools.remote import header_env_reads

    shared = parse_components(components, source="the sealed components file") if components is not None else None
    resolved = resolve_references(document, source="the sealed flow", components=shared.table if shared else None,
                                  components_source=shared.source if shared else "--components")
    out: dict[str, EnvRead] = {}
    for path, config in _configs(resolved, skip_metadata=True):
        for key in _FROM_ENV:
            value = config.get(key)
            name = env_reference(value) if isinstance(value, str) else None
            if name is not None:
                out.setdefault(name, EnvRead(name, f"{key} of {_label(config, path)}"))
        if config.get("api_key") is None and config.get("component_type") == "OpenAiConfig":
            out.setdefault(OPENAI_DEFAULT, EnvRead(
                OPENAI_DEFAULT, f"api_key of {_label(config, path)}, which gives none (sent if set)", required=False))
        if not config.get("api_key") and config.get("component_type") == GEMINI_AUTH:
            out.setdefault(GEMINI_DEFAULT, EnvRead(
                GEMINI_DEFAULT, f"api_key of {_label(config, path)}, which gives none (sent if set)", required=False))

    for name, where in header_env_reads(resolved):
        out.setdefault(name, EnvRead(name, where))

    for name, where in postgres_env_reads(resolved):
        out.setdefault(name, EnvRead(name, where))
    return list(out.values())


class _Found(Exception):
    """Ends the payload walk once the flow's bytes are read and checked."""


class _Collect:
    def __init__(self, keep: bool, out: bytearray, *, last: bool = True) -> None:
        self._keep, self._out, self._last = keep, out, last

    def write(self, chunk: memoryview) -> None:
        if self._keep:
            self._out += chunk

    def finish(self) -> None:
        if self._keep and self._last:
            raise _Found()

    def abort(self) -> None:
        self._out.clear()


def sealed_flow_reads(bundle: Path) -> list[EnvRead]:
    """The variables the flow sealed in `bundle` reads. Nothing is trusted or unpacked: the
    flow's bytes are read from the archive and checked against the manifest's sha256."""
    what = str(bundle)
    data = bytearray()
    shared = bytearray()
    with open_file(bundle) as fh:
        head = read_head(fh, what=what, limits=DEFAULT_LIMITS)
        manifest = sealed_manifest(head, what=what, limits=DEFAULT_LIMITS)
        wanted = {manifest.flow: data}
        if manifest.components is not None:
            wanted[manifest.components] = shared
        seen: set[str] = set()

        def collect(item: Any) -> _Collect:
            keep = item.path in wanted
            if keep:
                seen.add(item.path)
            # The walk ends once the last member wanted is read (and checked against the manifest).
            return _Collect(keep, wanted.get(item.path, bytearray()), last=keep and seen == set(wanted))

        try:
            walk_payload(head.reader, manifest, collect, what=what)
        except _Found:
            pass
        else:
            missing = sorted(set(wanted) - seen)
            raise MalformedBundleError(f"{what}: the file {missing[0] if missing else manifest.flow!r} the manifest "
                                       "names is not in the payload")
    flow = manifest.flow
    try:
        components = None
        if manifest.components is not None:
            name = manifest.components
            components = _parse_text(bytes(shared).decode("utf-8"), detect_format(Path(name)), f"{what}: {name}")
        return env_reads(_parse_text(bytes(data).decode("utf-8"), detect_format(Path(flow)), f"{what}: {flow}"),
                         components)
    except UnicodeDecodeError:
        raise MalformedBundleError(f"{what}: the sealed flow {flow} is not UTF-8 text") from None
    except DocumentError as exc:
        raise MalformedBundleError(f"{what}: the sealed flow does not load: {exc}") from None
    except RecursionError:
        raise MalformedBundleError(f"{what}: the sealed flow {flow} nests too deeply") from None
