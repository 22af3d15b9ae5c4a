"""Build Agent Spec flow documents for tests, in the wire format users write.

    f = FlowDoc("demo")
    start = f.start(["query"])
    agent = f.agent("agent", model_url, tools=[server_tool("echo", ["message"])])
    end = f.end(["result"])
    f.control(start, agent); f.control(agent, end)
    f.data(start, "query", agent, "query")
    path = f.write(tmp_path / "flow.json")
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any


def prop(title: str, type_: str = "string", **extra: Any) -> dict[str, Any]:
    return {"title": title, "type": type_, **extra}


def props(items) -> list[dict[str, Any]]:
    out = []
    for item in items:
        out.append(prop(item) if isinstance(item, str) else item)
    return out


def server_tool(name: str, inputs=(), outputs=(), description: str | None = None) -> dict[str, Any]:
    return {
        "component_type": "ServerTool",
        "id": f"tool-{name}-{uuid.uuid4().hex[:6]}",
        "name": name,
        "description": description or f"the {name} tool",
        "inputs": props(inputs),
        "outputs": props(outputs),
    }


def llm_config(url: str, *, name: str = "scripted", api_key: str | None = None,
               component_type: str = "OpenAiCompatibleConfig", **extra: Any) -> dict[str, Any]:
    cfg = {"component_type": component_type, "id": f"llm-{uuid.uuid4().hex[:6]}", "name": name,
           "model_id": "scripted", "url": url, **extra}
    if api_key is not None:
        cfg["api_key"] = api_key
    return cfg


class FlowDoc:
    def __init__(self, name: str = "test-flow", *, version: str = "26.3.1", use_refs: bool = True) -> None:
        self.name = name
        self.version = version
        self.use_refs = use_refs
        self.components: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.controls: list[dict[str, Any]] = []
        self.datas: list[dict[str, Any]] = []
        self.start_id: str | None = None
        self.extra_refs: dict[str, Any] = {}

    # ---- nodes
    def _node(self, component_type: str, name: str, inputs=(), outputs=(), **fields: Any) -> str:
        node_id = f"{name}-{uuid.uuid4().hex[:6]}"
        self.components[node_id] = {"component_type": component_type, "id": node_id, "name": name,
                                    "inputs": props(inputs), "outputs": props(outputs), **fields}
        self.order.append(node_id)
        return node_id

    def start(self, inputs=(), name: str = "start") -> str:
        node = self._node("StartNode", name, inputs, inputs)
        self.start_id = node
        return node

    def end(self, inputs=(), name: str = "end") -> str:
        return self._node("EndNode", name, inputs, inputs, branches=[])

    def tool_node(self, name: str, tool: dict[str, Any], inputs=None, outputs=None) -> str:
        return self._node("ToolNode", name, tool["inputs"] if inputs is None else inputs,
                          tool["outputs"] if outputs is None else outputs, tool=tool)

    def llm(self, name: str, config: dict[str, Any], prompt: str, inputs=(), outputs=("generated_text",)) -> str:
        return self._node("LlmNode", name, inputs, outputs, llm_config=config, prompt_template=prompt)

    def agent(self, name: str, config: dict[str, Any] | str, *, tools=(), system_prompt: str = "You help.",
              inputs=("query",), outputs=("result",)) -> str:
        if isinstance(config, str):
            config = llm_config(config)
        agent = {"component_type": "Agent", "id": f"agent-{uuid.uuid4().hex[:6]}", "name": f"{name}-agent",
                 "inputs": props(inputs), "outputs": props(outputs), "llm_config": config,
                 "system_prompt": system_prompt, "tools": list(tools)}
        return self._node("AgentNode", name, inputs, outputs, agent=agent)

    def branching(self, name: str, mapping: dict[str, str], input_title: str = "branching_mapping_key") -> str:
        return self._node("BranchingNode", name, [input_title], [], mapping=mapping,
                          branches=sorted(set(mapping.values()) | {"default"}))

    def flow_node(self, name: str, subflow: dict[str, Any], inputs=(), outputs=()) -> str:
        return self._node("FlowNode", name, inputs, outputs, subflow=subflow)

    # ---- edges
    def _ref(self, node_id: str) -> dict[str, Any]:
        return {"$component_ref": node_id} if self.use_refs else self.components[node_id]

    def control(self, src: str, dst: str, branch: str | None = None) -> None:
        self.controls.append({"component_type": "ControlFlowEdge", "id": f"c{len(self.controls)}",
                              "name": f"{self.components[src]['name']}_to_{self.components[dst]['name']}",
                              "from_node": self._ref(src), "from_branch": branch, "to_node": self._ref(dst)})

    def data(self, src: str, output: str, dst: str, input_: str) -> None:
        self.datas.append({"component_type": "DataFlowEdge", "id": f"d{len(self.datas)}",
                           "name": f"{self.components[src]['name']}_{output}_to_{self.components[dst]['name']}",
                           "source_node": self._ref(src), "source_output": output,
                           "destination_node": self._ref(dst), "destination_input": input_})

    # ---- output
    def document(self) -> dict[str, Any]:
        assert self.start_id is not None, "add a start node"
        start = self.components[self.start_id]
        # No `outputs`: the flow's are those of its EndNodes (an empty list would say it has none).
        # No data edges added: the flow is wired by name (`data_flow_connections: null`); with an
        # empty list an input that has a default would keep it rather than read the output of its name.
        doc: dict[str, Any] = {
            "component_type": "Flow", "agentspec_version": self.version, "id": f"flow-{uuid.uuid4().hex[:6]}",
            "name": self.name, "inputs": start["inputs"],
            "start_node": self._ref(self.start_id),
            "nodes": [self._ref(n) for n in self.order],
            "control_flow_connections": self.controls,
            "data_flow_connections": self.datas or None,
        }
        if self.use_refs:
            doc["$referenced_components"] = {**self.components, **self.extra_refs}
        return doc

    def write(self, path: Path) -> Path:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            path.write_text(yaml.safe_dump(self.document(), allow_unicode=True, sort_keys=False), encoding="utf-8")
        else:
            path.write_text(json.dumps(self.document(), ensure_ascii=False, indent=2), encoding="utf-8")
        return path


def write_tool(tools_dir: Path, filename: str, body: str) -> Path:
    """Write an executable Python tool; `body` runs with `args` (stdin JSON) and must set `out`."""
    tools_dir.mkdir(parents=True, exist_ok=True)
    path = tools_dir / filename
    code = "#!/usr/bin/env python3\nimport json, os, sys\nargs = json.load(sys.stdin)\nout = {}\n" + body + \
        "\njson.dump(out, sys.stdout, ensure_ascii=False)\n"
    path.write_text(code, encoding="utf-8")
    path.chmod(0o755)
    return path


def write_script(tools_dir: Path, filename: str, text: str) -> Path:
    tools_dir.mkdir(parents=True, exist_ok=True)
    path = tools_dir / filename
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path
