"""What a flow shows the person running it: the messages of its OutputMessageNodes.

The specification appends each to the flow's conversation as the agent's message. A heddle run
has no chat window, so a message is shown twice over: as a `message` event when its node runs
(`heddle run` prints it on stderr, `--protocol heddle` and the server's event stream carry it),
and in the run's result, where the messages of the run, in the order they were shown, sit
beside its outputs under `messages` (`heddle run --outputs`, the server's answer,
`heddle.RunResult.messages`).

`messages` is then a key of the run's, next to the document's outputs: a flow that declares an
output of that name and can show a message is refused, rather than one hiding the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.walk import components

MESSAGES = "messages"


def with_messages(outputs: Mapping[str, Any], messages: Sequence[str]) -> dict[str, Any]:
    """What `heddle run --outputs` prints: the outputs, and the run's messages when it showed any."""
    return {**outputs, MESSAGES: list(messages)} if messages else dict(outputs)


def message_problems(flow: c.Flow, warnings: list[str] | None = None) -> list[str]:
    """What is wrong with how the top-level `flow` shows its messages; adds to `warnings` what the
    specification allows but a reader of the messages should know."""
    shown = [(where, node) for where, node in components(flow) if isinstance(node, c.OutputMessageNode)]
    if not shown:
        return []
    problems = []
    if MESSAGES in io.titles(io.flow_outputs(flow)):
        where, node = shown[0]
        problems.append(f"flow {flow.name!r} declares an output named {MESSAGES!r}, and {where} (OutputMessageNode "
                        f"{node.name!r}) shows messages, which a run gives under that name beside the outputs; "
                        "rename the flow's output")
    if warnings is not None:
        for where, parallel in components(flow):
            if not isinstance(parallel, c.ParallelFlowNode | c.ParallelMapNode):
                continue
            inner = [(at, node) for at, node in components(parallel, where)
                     if isinstance(node, c.OutputMessageNode)]
            if inner:
                at, node = inner[0]
                warnings.append(f"{at}: OutputMessageNode {node.name!r} runs inside {parallel.component_type} "
                                f"{parallel.name!r}, whose subflows run side by side: their messages are shown in the "
                                "order they happen to be reached, which can change from run to run")
    return problems
