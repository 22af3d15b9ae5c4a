"""`heddle init DIR`: a starter agent that runs as printed."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

from heddle.errors import UsageError

FLOW = """\
# A starter agent: start -> agent (may call the word_count tool) -> end.
# The model is the scripted one from model.yaml, served on port %(port)d as `heddle init` printed;
# point `url` at any OpenAI-compatible server (and set api_key: "$OPENAI_API_KEY") to use a real model.
component_type: Flow
agentspec_version: 26.1.0
id: starter-flow
name: starter
inputs:
  - {title: text, type: string}
outputs:
  - {title: result, type: string}
start_node: {$component_ref: start}
nodes:
  - {$component_ref: start}
  - {$component_ref: agent}
  - {$component_ref: end}
control_flow_connections:
  - {component_type: ControlFlowEdge, id: e1, name: start_to_agent,
     from_node: {$component_ref: start}, from_branch: null, to_node: {$component_ref: agent}}
  - {component_type: ControlFlowEdge, id: e2, name: agent_to_end,
     from_node: {$component_ref: agent}, from_branch: null, to_node: {$component_ref: end}}
# No data_flow_connections: each node's inputs are the outputs of the same name.
$referenced_components:
  model:
    component_type: OpenAiCompatibleConfig
    id: model
    name: scripted-model
    model_id: scripted
    url: http://127.0.0.1:%(port)d/v1
  start:
    component_type: StartNode
    id: start
    name: start
    inputs: [{title: text, type: string}]
    outputs: [{title: text, type: string}]
  agent:
    component_type: AgentNode
    id: agent
    name: agent
    inputs: [{title: text, type: string}]
    outputs: [{title: result, type: string}]
    agent:
      component_type: Agent
      id: assistant
      name: assistant
      llm_config: {$component_ref: model}
      # An Agent declares what its node passes in (the prompt's placeholders) and gives back.
      inputs: [{title: text, type: string}]
      outputs: [{title: result, type: string}]
      system_prompt: "Count the words in this text with the word_count tool, then answer in one sentence: {{text}}"
      tools:
        - component_type: ServerTool
          id: word_count
          name: word_count
          description: Counts the words in a text.
          inputs: [{title: text, type: string}]
          outputs: [{title: words, type: integer}]
  end:
    component_type: EndNode
    id: end
    name: end
    inputs: [{title: result, type: string}]
    outputs: [{title: result, type: string}]
"""

TOOL = """\
#!/usr/bin/env python3
# A heddle tool: one JSON object on stdin, one JSON object on stdout.
import json
import sys

args = json.load(sys.stdin)
json.dump({"words": len(str(args.get("text", "")).split())}, sys.stdout)
"""

MODEL = """\
# What the scripted model answers, one entry per chat-completions request, in order
# (with `heddle model serve --loop`, from the top again once used up: one run takes both).
- tool_calls:
    - name: word_count
      arguments: {text: "the quick brown fox"}
- content: "Your text has 4 words."
"""


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it); the model server takes it later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_starter(directory: Path, port: int | None = None) -> list[str]:
    """Write the starter into `directory` and return the lines telling the user how to run it.

    The flow points at the scripted model on `port` (127.0.0.1); None or 0 picks a free one now,
    so two starters, or a starter beside another server, do not collide on a fixed number.
    """
    if port is not None and not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is 0 to 65535 (0 picks a free one)")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory}: already exists and is not an empty folder; choose a new one")
    port = port or free_port()
    (directory / "tools").mkdir(parents=True, exist_ok=True)
    (directory / "flow.yaml").write_text(FLOW % {"port": port}, encoding="utf-8")
    tool = directory / "tools" / "word_count.py"
    tool.write_text(TOOL, encoding="utf-8")
    tool.chmod(0o755)
    (directory / "model.yaml").write_text(MODEL, encoding="utf-8")
    d = shlex.quote(str(directory))
    return [
        f"Wrote a starter agent to {directory}:",
        f"  {directory}/flow.yaml           start -> agent (with the word_count tool) -> end",
        f"  {directory}/tools/word_count.py a tool: JSON in on stdin, JSON out on stdout",
        f"  {directory}/model.yaml          a scripted model, so the agent runs without an API key",
        "",
        "Run it (the model repeats its script with --loop, so the run works again and again):",
        f"  heddle model serve --script {d}/model.yaml --port {port} --loop &",
        f"  heddle run {d}/flow.yaml --tools-dir {d}/tools --input '{{\"text\": \"the quick brown fox\"}}'",
    ]
