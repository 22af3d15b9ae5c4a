"""Settings per component type: `--plugin-config Type=JSON|@file`, checked against the
component's `configSchema` before anything runs. A component with a schema and no settings
is checked against `{}`, so a required setting that was forgotten is named at start-up."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from heddle.plugin_host.errors import PluginLoadError
from heddle.plugin_host.manifest import Component
from heddle.safeparse import json_problem, loads_strict_json


def parse_config_option(spec: str) -> tuple[str, Any]:
    """`Type=JSON` or `Type=@FILE` as (component type, settings)."""
    ctype, sep, value = spec.partition("=")
    ctype = ctype.strip()
    if not sep or not ctype:
        raise PluginLoadError(f"--plugin-config {spec!r}: give TYPE=JSON or TYPE=@FILE, e.g. "
                              "--plugin-config RetryPolicy='{\"attempts\": 3}'")
    source = f"--plugin-config {ctype}"
    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PluginLoadError(f"{source}=@{path}: cannot read {path}: {exc.strerror}") from None
        source = f"{source}=@{path}"
    try:
        return ctype, loads_strict_json(text)
    except ValueError as exc:
        raise PluginLoadError(f"{source}: not valid JSON ({json_problem(exc)}); "
                              "give a JSON value such as '{\"key\": 1}'") from None


def parse_config_options(specs: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in specs:
        ctype, value = parse_config_option(spec)
        if ctype in out:
            raise PluginLoadError(f"--plugin-config {ctype}: given twice; give each component type's settings once")
        out[ctype] = value
    return out


def _with_defaults(schema: dict[str, Any], value: Any) -> Any:
    if not isinstance(value, dict) or not isinstance(schema.get("properties"), dict):
        return value
    filled = copy.deepcopy(value)
    for name, prop in schema["properties"].items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])
    return filled


def resolve_configs(components: Mapping[str, Component], given: Mapping[str, Any], *,
                    require: bool = True) -> dict[str, Any]:
    """Every component type's settings, checked; `given` names only types that were loaded.
    Without `require`, only the settings given are checked (a bundle is sealed without them)."""
    import jsonschema

    unknown = sorted(set(given) - set(components))
    if unknown:
        known = ", ".join(sorted(components)) or "none (no plugin is loaded)"
        raise PluginLoadError(f"--plugin-config {unknown[0]}: no loaded plugin declares component type "
                              f"{unknown[0]!r}; the loaded types are: {known}")
    out: dict[str, Any] = {}
    for ctype, component in components.items():
        schema = component.config_schema
        value = given.get(ctype)
        if schema is None or (value is None and not require):
            if value is not None:
                out[ctype] = value
            continue
        value = _with_defaults(schema, {} if value is None else value)
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
        if errors:
            err = errors[0]
            where = "/".join(str(p) for p in err.path)
            at = f" at {where}" if where else ""
            hint = "" if ctype in given else f"; pass --plugin-config {ctype}='{{...}}'"
            raise PluginLoadError(f"--plugin-config {ctype}: the settings do not match the schema of "
                                  f"{component.label()}{at}: {err.message}{hint}")
        out[ctype] = value
    return out
