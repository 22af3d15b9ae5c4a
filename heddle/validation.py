"""A flow's validation report: what was parsed, the graph verdict, the tools it names and their
input-schema fingerprints. `heddle validate` prints it; `POST /v1/validate` answers with it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec.roots import document_root
from heddle.graph import check_flow, referenced_tools
from heddle.tools.schema import input_fingerprint

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow


def validation_report(flow: Flow, *, tools: Mapping[str, Path] | None, source: str,
                      tools_dir: Path | None = None) -> dict[str, Any]:
    """The report on `flow` (read from `source`); `tools` None means the tools were not looked for."""
    warnings: list[str] = []
    problems = check_flow(flow, tools=tools, tools_dir=tools_dir, warnings=warnings)
    named = referenced_tools(flow)
    tool_rows = [{
        "name": name,
        "fingerprint": input_fingerprint(named[name]),
        "executable": str(tools[name]) if tools and name in tools else None,
    } for name in sorted(named)]
    kinds: dict[str, int] = {}
    for node in flow.nodes:
        kinds[node.component_type] = kinds.get(node.component_type, 0) + 1
    return {
        "source": source,
        "flow": flow.name,
        "top_level": document_root(flow).component_type,
        "agentspec_version": flow.agentspec_version,
        "nodes": kinds,
        "edges": {"control": len(flow.control_flow_connections), "data": len(flow.data_flow_connections or [])},
        "tools": tool_rows,
        "tools_checked": tools is not None,
        "valid": not problems,
        "problems": problems,
        "warnings": warnings,
        # Where a run may stop to wait for a person (heddle.agentspec.waits): such a document runs only in a session.
        "waits": list(document_root(flow).waits),
    }
