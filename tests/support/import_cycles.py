"""An import-linter contract: no import cycle between any two modules of the root package.

import-linter's own `acyclic_siblings` looks at the siblings of one package at a time, with each
subpackage taken whole; this one looks at modules, across packages too (grimp's graph reads the
imports inside functions as well), so a cycle through `agentspec/`, `tools/` and `engine/` is found.
An import the design needs to go round (a recursion) is named in `ignore_imports`, with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet

import grimp
from importlinter.application import contract_utils, output
from importlinter.application.contract_utils import AlertLevel
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected group of two or more modules (or one importing itself), sorted."""
    edges: Mapping[str, AbstractSet[str]] = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Tarjan's algorithm, iterative: the graph is deep enough for Python's recursion limit to matter.
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, rest = work[-1]
            for nxt in rest:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = [stack.pop()]
                    while group[-1] != node:
                        group.append(stack.pop())
                    if len(group) > 1 or node in edges[node]:
                        found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(AlertLevel, default=AlertLevel.ERROR)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=self.ignore_imports,  # type: ignore[arg-type]
            unmatched_alerting=self.unmatched_ignore_imports_alerting,  # type: ignore[arg-type]
        )
        found = cycles(graph)
        details = [[(a, b) for a in group for b in sorted(graph.find_modules_directly_imported_by(a)) if b in group]
                   for group in found]
        return ContractCheck(kept=not found, warnings=list(removal.warnings),
                             ignored_import_count=removal.ignored_import_count, metadata={"cycles": details})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group in check.metadata["cycles"]:
            modules = sorted({a for a, _ in group})
            output.print_error(f"{len(modules)} modules import each other in a cycle: {', '.join(modules)}")
            for importer, imported in group:
                output.print_error(f"    {importer} -> {imported}", bold=False)
            output.new_line()
