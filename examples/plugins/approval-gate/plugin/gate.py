"""An approval gate: a tool call whose argument matches a rule is refused before it runs, and
the model is told why, so it can find a safer way. Calls listed in `approved` (exact argument
values) go through."""

import re

from heddle.plugin import Plugin, reject

plugin = Plugin()


@plugin.before("ApprovalGate", "toolCall")
def gate(call):
    tool, arguments = call.params["tool"], call.params["arguments"]
    for rule in call.config["rules"]:
        value = arguments.get(rule["argument"])
        if rule["tool"] != tool or not isinstance(value, str) or value in call.config["approved"]:
            continue
        if re.search(rule["pattern"], value):
            call.emit("approval_needed", {"tool": tool, "argument": rule["argument"], "value": value})
            why = rule.get("why", "it matches a rule of the approval gate")
            return reject(f"{tool} {rule['argument']}={value!r} needs a person's approval because {why}; "
                          "do not retry it, find another way or ask the user")
    return None


if __name__ == "__main__":
    plugin.serve()
