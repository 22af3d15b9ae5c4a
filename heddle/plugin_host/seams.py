"""The five seams where middleware is asked, and the verdicts each admits.

A middleware answers `before`/`after` with `{"verdict": NAME, ...}`; `null` or `{}` is the
neutral verdict (proceed before, pass after). A verdict its seam does not admit, or one
missing what it must carry, is refused: the plugin is broken, so the call fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.manifest import Component, Phase

NEUTRAL: dict[Phase, str] = {"before": "proceed", "after": "pass"}

ADMITTED: dict[tuple[str, Phase], tuple[str, ...]] = {
    ("node", "before"): ("proceed", "modify", "replace", "reject"),
    ("node", "after"): ("pass", "replace", "fail"),
    ("nodeError", "after"): ("pass", "replace", "retry", "fail"),
    ("toolCall", "before"): ("proceed", "modify", "replace", "reject"),
    ("toolCall", "after"): ("pass", "replace", "fail"),
    ("modelCall", "before"): ("proceed", "modify", "replace", "reject"),
    ("modelCall", "after"): ("pass", "replace", "retry", "fail"),
    ("agentRound", "before"): ("proceed", "reject"),
    ("agentRound", "after"): ("pass", "fail"),
}

# The field a modify or replace verdict carries at each seam.
CARRIES: dict[tuple[str, str], str] = {
    ("node", "modify"): "input",
    ("node", "replace"): "output",
    ("nodeError", "replace"): "output",
    ("toolCall", "modify"): "arguments",
    ("toolCall", "replace"): "output",
    ("modelCall", "modify"): "messages",
    ("modelCall", "replace"): "response",
}

MAX_DELAY_S = 30.0


@dataclass(frozen=True)
class Verdict:
    name: str
    value: Any = None  # the new input, output, arguments, messages or response
    branch: str | None = None  # a replaced node output's branch
    tools: Any = None  # a modified model call's tool definitions, when `sets_tools`
    sets_tools: bool = False
    reason: str = ""
    delay: float = 0.0

def _refuse(component: Component, where: str, problem: str) -> PluginError:
    return PluginError(component.plugin, f"{component.component_type} answered {where} with {problem}")


def parse_verdict(component: Component, seam: str, phase: Phase, result: Any) -> Verdict:
    """The verdict in a middleware's answer, or PluginError saying why it is refused."""
    where = f"{seam}.{phase}"
    if result is None or result == {}:
        return Verdict(NEUTRAL[phase])
    if not isinstance(result, dict) or not isinstance(result.get("verdict"), str):
        raise _refuse(component, where, f"{_short(result)}; answer {{\"verdict\": ...}} (or null to {NEUTRAL[phase]})")
    name = result["verdict"]
    admitted = ADMITTED[(seam, phase)]
    if name not in admitted:
        raise _refuse(component, where, f"verdict {name!r}, which {where} does not admit; it admits "
                      + ", ".join(admitted))
    reason = result.get("reason", "")
    if not isinstance(reason, str):
        raise _refuse(component, where, f"a {name!r} verdict whose reason is not a string")
    if name in ("reject", "fail"):
        return Verdict(name, reason=reason or "no reason given")
    if name == "retry":
        delay = result.get("delay", 0)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise _refuse(component, where, "a retry whose delay is not a number of seconds >= 0")
        return Verdict(name, delay=min(float(delay), MAX_DELAY_S), reason=reason)
    if name in NEUTRAL.values():
        return Verdict(name)
    key = CARRIES[(seam, name)]
    if seam == "modelCall" and name == "modify":
        return _model_modify(component, where, result)
    if key not in result:
        raise _refuse(component, where, f"a {name!r} verdict without {key!r}; give the new {key}")
    value = result[key]
    if not isinstance(value, dict):
        raise _refuse(component, where, f"a {name!r} verdict whose {key!r} is not a JSON object")
    branch = result.get("branch")
    if branch is not None and (key != "output" or seam not in ("node", "nodeError") or not isinstance(branch, str)):
        raise _refuse(component, where, f"a {name!r} verdict with a 'branch' it cannot carry")
    return Verdict(name, value=value, branch=branch, reason=reason)


def _model_modify(component: Component, where: str, result: dict[str, Any]) -> Verdict:
    messages, tools = result.get("messages"), result.get("tools")
    if messages is None and "tools" not in result:
        raise _refuse(component, where, "a 'modify' verdict without 'messages' or 'tools'")
    if messages is not None and (not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)):
        raise _refuse(component, where, "a 'modify' verdict whose 'messages' is not a list of message objects")
    if tools is not None and not isinstance(tools, list):
        raise _refuse(component, where, "a 'modify' verdict whose 'tools' is not a list")
    return Verdict("modify", value=messages, tools=tools, sets_tools="tools" in result)


def _short(value: Any) -> str:
    import json

    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."
