"""The report `heddle validate` prints: what it parsed, the graph verdict, tools and fingerprints."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def validation_report(flow, *, tools: Mapping[str, Path] | None, source: str,
                      tools_dir: Path | None = None) -> dict[str, Any]:
    from heddle.graph import check_flow, referenced_tools
    from heddle.tools.schema import input_fingerprint

    problems = check_flow(flow, tools=tools, tools_dir=tools_dir)
    named = referenced_tools(flow)
    tool_rows = []
    for name in sorted(named):
        tool_rows.append({
            "name": name,
            "fingerprint": input_fingerprint(named[name]),
            "executable": str(tools[name]) if tools and name in tools else None,
        })
    kinds: dict[str, int] = {}
    for node in flow.nodes:
        kinds[node.component_type] = kinds.get(node.component_type, 0) + 1
    return {
        "source": source,
        "flow": flow.name,
        "agentspec_version": flow.agentspec_version,
        "nodes": kinds,
        "edges": {"control": len(flow.control_flow_connections), "data": len(flow.data_flow_connections or [])},
        "tools": tool_rows,
        "tools_checked": tools is not None,
        "valid": not problems,
        "problems": problems,
    }


def print_validation(report: dict[str, Any]) -> None:
    import sys

    out = sys.stdout.write
    nodes = ", ".join(f"{n} {k}" for k, n in sorted(report["nodes"].items()))
    out(f"flow      {report['flow']!r} from {report['source']} (agentspec {report['agentspec_version']})\n")
    out(f"nodes     {nodes}\n")
    out(f"edges     {report['edges']['control']} control, {report['edges']['data']} data\n")
    if report["tools"]:
        out("tools\n")
        for row in report["tools"]:
            where = row["executable"] or ("MISSING" if report["tools_checked"] else "(no --tools-dir given)")
            out(f"  {row['name']:<20} {row['fingerprint']}  {where}\n")
    else:
        out("tools     none\n")
    if report["valid"]:
        out("graph     valid\n")
    else:
        out(f"graph     INVALID ({len(report['problems'])} problem(s))\n")
        for problem in report["problems"]:
            out(f"  - {problem}\n")
