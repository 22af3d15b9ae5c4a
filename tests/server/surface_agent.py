"""A sealed agent for the protocol surfaces' tests (MCP, the Responses API): a clerk that looks things
up (a tool) and pays (a tool that needs a person's approval), and the scripted model's answers for one
conversation of two turns: a tool call, then a payment approved."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import heddle
from heddle.format.keys import generate
from tests.server.flows import write_tools
from tests.support.flows import llm_config, server_tool

LOOKUP = {"tool_calls": [{"name": "lookup", "arguments": {"item": "ladder"}}]}
PAY = {"tool_calls": [{"name": "pay", "arguments": {"amount": 5}}]}
# Turn 1: "Where is the ladder?" -> lookup -> the answer; turn 2: "Pay 5." -> pay (approved) -> the answer.
CONVERSATION: list[dict[str, Any]] = [LOOKUP, {"content": "In the shed."}, PAY, {"content": "Paid 5."}]
KEY_ENV = {"HEDDLE_SESSION_KEY": "surfaces-test-session-key-0123456789abcdef"}


@dataclass
class SealedAgent:
    bundle: Path
    pub: Path
    paid: Path  # each run of `pay` adds a line

    def payments(self) -> int:
        return len(self.paid.read_text().splitlines()) if self.paid.exists() else 0


def seal_agent(root: Path, model_url: str) -> SealedAgent:
    paid = root / "paid.log"
    tools = write_tools(root / "tools", {
        "lookup": "#!/bin/sh\ncat >/dev/null\necho '{\"found\": \"in the shed\"}'\n",
        "pay": f"#!/bin/sh\ncat >/dev/null\necho paid >> {paid}\necho '{{\"paid\": 5}}'\n",
    })
    doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "clerk", "name": "clerk",
           "description": "A clerk who finds things and pays for them.", "llm_config": llm_config(model_url),
           "system_prompt": "You help.",
           "tools": [server_tool("lookup", ["item"], ["found"]),
                     {**server_tool("pay", [{"title": "amount", "type": "integer"}], ["paid"]),
                      "requires_confirmation": True}]}
    flow = root / "clerk.json"
    flow.write_text(json.dumps(doc))
    key = generate(root / "me", None)
    bundle = heddle.seal(flow, tools_dir=tools, sign_key=key.private_path, output=root / "clerk.heddle").path
    return SealedAgent(bundle, key.public_path, paid)


def script_next(app: Any, entries: list[dict[str, Any]]) -> None:
    """The scripted model answers the next requests with `entries` (the ones before are answered already)."""
    app.script = [{"content": "-"}] * len(app.requests) + list(entries)
