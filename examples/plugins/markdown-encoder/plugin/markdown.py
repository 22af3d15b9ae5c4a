"""An encoder: heddle sends each event of a run, in order, and writes what this returns."""

import json

from heddle.plugin import Plugin

plugin = Plugin()


def code(value):
    return "`" + json.dumps(value, ensure_ascii=False).replace("`", "'") + "`"


def ms(call, value):
    return f" ({value:.0f} ms)" if call.config["timings"] else ""


@plugin.encode("MarkdownTranscript")
def encode(call):
    event, state = call.event, call.state
    kind = event["type"]
    if kind == "flow_start":
        return f"# Run of `{event['flow']}`\n\nInput: {code(event['inputs'])}\n"
    if kind == "node_start" and event["node_type"] not in ("StartNode", "EndNode"):
        state["step"] = state.get("step", 0) + 1
        state["streaming"] = False
        return f"\n## {state['step']}. {event['node']} ({event['node_type']})\n\n"
    if kind == "tool_call":
        return f"- tool `{event['tool']}` called with {code(event['arguments'])}\n"
    if kind == "tool_result":
        mark = "answered" if event["ok"] else "failed:"
        return f"  - {mark} {code(event['output'])}{ms(call, event['duration_ms'])}\n"
    if kind == "token_delta":
        opening = "" if state.get("streaming") else "> "
        state["streaming"] = True
        return opening + event["text"].replace("\n", "\n> ")
    if kind == "node_complete" and event["node_type"] not in ("StartNode", "EndNode"):
        closing = "\n" if state.pop("streaming", False) else ""
        branch = f", left by `{event['branch']}`" if event.get("branch") else ""
        return f"{closing}\nDone{ms(call, event['duration_ms'])}{branch}: {code(event['outputs'])}\n"
    if kind == "warning":
        return f"\n> **warning:** {event['message']}\n"
    return None


@plugin.finish("MarkdownTranscript")
def finish(call):
    if call.params.get("error"):
        return f"\n**The run failed:** {call.params['error']['message']}\n"
    if call.params.get("waiting"):
        waiting = call.params["waiting"]
        what = {"message": "a message", "approval": "an approval", "client_tool": "a client tool's result"}
        return f"\n## Waiting\n\n`{waiting['node']}` waits for {what.get(waiting['kind'], waiting['kind'])}.\n"
    state = json.dumps(call.params["state"], ensure_ascii=False, indent=2)
    return f"\n## Result\n\n```json\n{state}\n```\n"


if __name__ == "__main__":
    plugin.serve()
