"""How `heddle validate` prints the validation report (made by heddle.validation)."""

from __future__ import annotations

from typing import Any


def print_validation(report: dict[str, Any]) -> None:
    import sys

    from heddle.textsafe import printable

    def out(text: str) -> None:
        # A report names what a document holds, and a document may come from anywhere.
        sys.stdout.write(printable(text))
    nodes = ", ".join(f"{n} {k}" for k, n in sorted(report["nodes"].items()))
    out(f"flow      {report['flow']!r} from {report['source']} (agentspec {report['agentspec_version']})\n")
    if report["top_level"] != "Flow":
        out(f"top level {report['top_level']}, run as the flow below\n")
    out(f"nodes     {nodes}\n")
    out(f"edges     {report['edges']['control']} control, {report['edges']['data']} data\n")
    if report["tools"]:
        out("tools\n")
        for row in report["tools"]:
            where = f"command {row['command']}" if row.get("command") else \
                row["executable"] or ("MISSING" if report["tools_checked"] else "(no --tools-dir given)")
            out(f"  {row['name']:<20} {row['fingerprint']}  {where}\n")
    else:
        out("tools     none\n")
    for warning in report.get("warnings", []):
        out(f"warning   {warning}\n")
    waits = report.get("waits", [])
    for where in waits:
        out(f"waits     {where}\n")
    if waits:
        out("note      it may wait for a person, so it runs only in a session (heddle run with --session NAME)\n")
    if report["valid"]:
        out("graph     valid\n")
    else:
        out(f"graph     INVALID ({len(report['problems'])} problem(s))\n")
        for problem in report["problems"]:
            out(f"  - {problem}\n")
