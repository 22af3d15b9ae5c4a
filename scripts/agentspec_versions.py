"""Print heddle/agentspec/agentspec_versions.json from the pyagentspec installed beside the python that runs it:
the first Agent Spec version of each component type and of each field, as pyagentspec dates them.

    python scripts/agentspec_versions.py > heddle/agentspec/agentspec_versions.json   # a python with pyagentspec

A type's version is its `min_agentspec_version`; a field's is the first version whose serialization
keeps it (`_versioned_model_fields_to_exclude`), with its default: pyagentspec refuses a document that
declares an older version and gives the field a value other than that default.
tests/examples/test_pyagentspec_valid.py holds the file to what this prints.
"""

import json
import warnings
from importlib.metadata import version
from typing import Any

warnings.simplefilter("ignore")

from pyagentspec._component_registry import BUILTIN_CLASS_MAP  # noqa: E402
from pyagentspec.versioning import AgentSpecVersionEnum  # noqa: E402

FIRST = AgentSpecVersionEnum.v25_4_1
VERSIONS = [v for v in AgentSpecVersionEnum if v >= FIRST]


def _default(info: Any) -> Any:
    value = info.default_factory() if info.default_factory is not None else info.default
    return json.loads(json.dumps(value, default=str))


def table() -> dict[str, Any]:
    types: dict[str, str] = {}
    fields: dict[str, dict[str, dict[str, Any]]] = {}
    for name, cls in sorted(BUILTIN_CLASS_MAP.items()):
        first = cls.model_fields["min_agentspec_version"].default
        if first > FIRST:
            types[name] = first.value
        try:
            component = cls.model_construct()
        except TypeError:
            continue  # an abstract class: no document names it
        kept = {v.value: set(component._versioned_model_fields_to_exclude(v)) for v in VERSIONS}
        for field in sorted(set().union(*kept.values()) & set(cls.model_fields)):
            since = next((v for v in VERSIONS if field not in kept[v.value]), None)
            if since is not None and since > FIRST:
                fields.setdefault(name, {})[field] = {"since": since.value,
                                                      "default": _default(cls.model_fields[field])}
    return {"pyagentspec": version("pyagentspec"), "types": types, "fields": fields}


if __name__ == "__main__":
    print(json.dumps(table(), indent=1, sort_keys=True))
