"""Executors of the nodes that run subflows: MapNode, ParallelMapNode, ParallelFlowNode, CatchExceptionNode.

Every subflow runs through `run_flow`, so its nodes emit their own events, count towards
--max-iterations (one count per node execution, whichever branch runs it) and build their own
workspaces. A parallel node runs at most `RunOptions.max_parallel` subflows at once; when one fails,
the others are cancelled (their tool processes killed, their workspaces removed) and that first
failure is the node's. CatchExceptionNode turns a failure of its subflow into its exception branch.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from heddle.agentspec import components as c
from heddle.engine.context import RunContext
from heddle.engine.journal import Journal
from heddle.engine.seams import Outcome
from heddle.errors import LimitError, RunError

if TYPE_CHECKING:
    from heddle.engine.run import FlowRun

T = TypeVar("T")

MapLike = c.MapNode | c.ParallelMapNode


async def walk_subflow(ctx: RunContext, flow: c.Flow, inputs: dict[str, Any]) -> FlowRun:
    """A node's subflow walked by the flow runner: the one place a node calls back into heddle.engine.run,
    which runs the node (a recursion the design needs, named in pyproject's import contract)."""
    from heddle.engine.run import run_flow

    return await run_flow(ctx, flow, inputs)


async def _run_flow(ctx: RunContext, flow: c.Flow, inputs: dict[str, Any]) -> dict[str, Any]:
    """The subflow's outputs, exactly (its defaults filled in)."""
    return (await walk_subflow(ctx, flow, inputs)).outputs


def _subflow_inputs(flow: c.Flow, values: dict[str, Any]) -> dict[str, Any]:
    """What the node was given of `flow`'s own inputs (the subflow fills the rest from its defaults)."""
    return {p["title"]: values[p["title"]] for p in c.flow_inputs(flow) if p["title"] in values}


async def concurrently(ctx: RunContext, works: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
    """Every `work()`, at most `max_parallel` at a time, results in the order given.

    The first failure cancels the rest and is raised as it is (its message already names the node
    and tool at fault, its type keeps its exit code and whether a CatchExceptionNode may catch it)."""
    limit = asyncio.Semaphore(ctx.options.max_parallel)

    async def bounded(i: int, work: Callable[[], Awaitable[T]]) -> T:
        # Each branch journals in a scope of its own, whatever order the branches finish in.
        with Journal.scope(f"p{i}"):
            async with limit:
                return await work()

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(bounded(i, work)) for i, work in enumerate(works)]
    except BaseExceptionGroup as failures:
        raise _first_failure(failures) from None
    return [task.result() for task in tasks]


def _first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    # TaskGroup lists failures in the order they happened; the others were cancelled because of the first.
    first = group.exceptions[0]
    return _first_failure(first) if isinstance(first, BaseExceptionGroup) else first


# ------------------------------------------------------------------ MapNode, ParallelMapNode


def _shape(schema: Any) -> Any:
    """A schema without the annotations that do not change what it admits, at every level."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in ("title", "description", "default")}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


def _iterates(node: MapLike, inner: c.Property, declared: c.Property | None, value: Any) -> bool:
    """Whether `value`, given for the subflow input `inner`, is iterated over or given to every run."""
    if not isinstance(value, list):
        return False
    if not {"array", "any"} & c.schema_types(inner):
        return True
    # The subflow's input takes a list itself: only the node's declared type can tell the two apart.
    name = c.ITERATED_PREFIX + inner["title"]
    if declared is not None:
        if _shape(declared) == _shape(inner):
            return False
        if _shape(declared) == {"type": "array", "items": _shape(inner)}:
            return True
    raise RunError(f"{node.component_type} {node.name!r}: input {name!r} is a list and its subflow's input "
                   f"{inner['title']!r} takes lists too, so it is unclear whether to iterate over it; declare "
                   f"{name!r} as an array of {inner['title']!r}'s type to iterate, or as that type itself to give "
                   "every run the same list")


def map_runs(node: MapLike, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """The subflow's inputs for each run, in list order."""
    label = f"{node.component_type} {node.name!r}"
    declared = {p["title"]: p for p in node.inputs}
    shared: dict[str, Any] = {}
    iterated: dict[str, list[Any]] = {}
    for inner in c.flow_inputs(node.subflow):
        name = c.ITERATED_PREFIX + inner["title"]
        if name not in inputs:
            if "default" in inner:
                continue
            raise RunError(f"{label}: nothing gives its input {name!r} (the subflow's {inner['title']!r}); "
                           "connect a list to it")
        value = inputs[name]
        if _iterates(node, inner, declared.get(name), value):
            iterated[inner["title"]] = value
        else:
            shared[inner["title"]] = value
    if not iterated:
        names = ", ".join(repr(c.ITERATED_PREFIX + p["title"]) for p in c.flow_inputs(node.subflow)) or "none"
        raise RunError(f"{label}: none of its inputs ({names}) was given a list to iterate over")
    lengths = {len(v) for v in iterated.values()}
    if len(lengths) > 1:
        sizes = ", ".join(f"{c.ITERATED_PREFIX}{k}: {len(v)}" for k, v in iterated.items())
        raise RunError(f"{label}: its iterated lists have different lengths ({sizes}); give lists of one length")
    count = lengths.pop()
    return [{**shared, **{k: v[i] for k, v in iterated.items()}} for i in range(count)]


def _number(label: str, title: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RunError(f"{label}: subflow output {title!r} is {type(value).__name__} {value!r}, "
                       "not a number its reducer can combine")
    return value


def reduce_outputs(node: MapLike, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each `collected_*` output from the runs' outputs, by its reducer."""
    label = f"{node.component_type} {node.name!r}"
    reducers = node.reducer_of()
    declared = {p["title"]: p for p in node.outputs}
    reduced: dict[str, Any] = {}
    for prop in c.flow_outputs(node.subflow):
        title = prop["title"]
        method = reducers.get(title)
        if method is None:
            continue
        name = c.COLLECTED_PREFIX + title
        values = []
        for i, outputs in enumerate(results):
            if title not in outputs:
                raise RunError(f"{label}: run {i} of its subflow ended without output {title!r}")
            values.append(outputs[title])
        if method == "append":
            reduced[name] = values
            continue
        numbers = [_number(label, title, v) for v in values]
        integer = c.schema_types(prop) == {"integer"}
        if method == "sum":
            # An empty sum is 0, of the output's own type.
            reduced[name] = sum(numbers) if integer else math.fsum(numbers) if numbers else 0.0
            continue
        if not numbers:
            default = declared.get(name, {})
            if "default" not in default:
                raise RunError(f"{label}: the {method} of no values is undefined (its list was empty); give "
                               f"output {name!r} a default for that case")
            reduced[name] = default["default"]
            continue
        if method == "average":
            mean = math.fsum(numbers) / len(numbers)
            if integer:
                if not mean.is_integer():
                    raise RunError(f"{label}: the average of {title!r} is {mean}, not an integer as the output's "
                                   "type says; declare the subflow's output a number")
                reduced[name] = int(mean)
            else:
                reduced[name] = mean
        else:
            reduced[name] = max(numbers) if method == "max" else min(numbers)
    return reduced


async def map_node(ctx: RunContext, node: MapLike, inputs: dict[str, Any]) -> Outcome:
    runs = map_runs(node, inputs)
    if isinstance(node, c.ParallelMapNode):
        results = await concurrently(ctx, [_bind(ctx, node.subflow, run) for run in runs])
    else:
        results = []
        for i, run in enumerate(runs):
            with Journal.scope(f"i{i}"):
                results.append(await _run_flow(ctx, node.subflow, run))
    return reduce_outputs(node, results), None


def _bind(ctx: RunContext, flow: c.Flow, inputs: dict[str, Any]) -> Callable[[], Awaitable[dict[str, Any]]]:
    return lambda: _run_flow(ctx, flow, inputs)


# ------------------------------------------------------------------ ParallelFlowNode


async def parallel_flow_node(ctx: RunContext, node: c.ParallelFlowNode, inputs: dict[str, Any]) -> Outcome:
    flows = node.subflows
    results = await concurrently(ctx, [_bind(ctx, flow, _subflow_inputs(flow, inputs)) for flow in flows])
    merged: dict[str, Any] = {}
    given_by: dict[str, int] = {}
    for i, outputs in enumerate(results):
        for title, value in outputs.items():
            j = given_by.setdefault(title, i)
            if j != i:
                # Checked on the declared outputs before the run; this catches undeclared ones.
                raise RunError(f"ParallelFlowNode {node.name!r}: subflows {flows[j].name!r} and {flows[i].name!r} "
                               f"both gave output {title!r}; the outputs of parallel subflows must have distinct "
                               "names")
            merged[title] = value
    return merged, None


# ------------------------------------------------------------------ CatchExceptionNode


def caught_info(exc: BaseException) -> str:
    """What `caught_exception_info` says: the error's kind and its one-line message (heddle's own
    messages name the node and tool; they carry no traceback and none of heddle's secrets)."""
    return f"{type(exc).__name__}: {exc}"


async def catch_exception_node(ctx: RunContext, node: c.CatchExceptionNode, inputs: dict[str, Any]) -> Outcome:
    try:
        walked = await walk_subflow(ctx, node.subflow, _subflow_inputs(node.subflow, inputs))
    except LimitError:
        # A run limit (iterations, timeout) ends the run: catching it would let a flow outlive its limits.
        raise
    except RunError as exc:
        return {**node.output_defaults(), c.CAUGHT_EXCEPTION_INFO: caught_info(exc)}, c.CAUGHT_EXCEPTION_BRANCH
    # The branch by name, "next" too: an edge may name it as well as leave from_branch null.
    return {**walked.outputs, c.CAUGHT_EXCEPTION_INFO: None}, walked.branch


Composite = c.MapNode | c.ParallelMapNode | c.ParallelFlowNode | c.CatchExceptionNode


async def run_composite(ctx: RunContext, node: Composite, inputs: dict[str, Any]) -> Outcome:
    """The step of a node that runs subflows."""
    if isinstance(node, c.ParallelFlowNode):
        return await parallel_flow_node(ctx, node, inputs)
    if isinstance(node, c.CatchExceptionNode):
        return await catch_exception_node(ctx, node, inputs)
    return await map_node(ctx, node, inputs)
