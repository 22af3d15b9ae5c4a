"""Real tool scripts for workspace tests and the way the engine runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.workspace import SandboxPolicy, Workspace, confine

SYSTEM_PREFIXES = ("/usr/", "/bin/", "/lib", "/opt/")


def tool_python() -> tuple[str, tuple[Path, ...]]:
    """An interpreter for tool scripts, and what the sandbox must be allowed to read for it.

    The test runner's own interpreter may live under a home folder (pyenv) that the
    sandbox hides; it is then exposed with --allow-read, the way a user would.
    """
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if exe.startswith(SYSTEM_PREFIXES):
        return exe, ()
    return exe, (Path(os.path.realpath(sys.base_prefix)),)


PYTHON, PYTHON_READ = tool_python()

# A tool that performs the probes it is given and reports each outcome as JSON.
PROBE = r'''
import json, os, socket, sys

def attempt(op):
    kind, arg = op["op"], op.get("arg")
    try:
        if kind == "read":
            with open(arg) as f:
                return {"ok": True, "value": f.read()}
        if kind == "write":
            with open(arg, "w") as f:
                f.write(op.get("data", "x"))
            return {"ok": True}
        if kind == "delete":
            os.remove(arg)
            return {"ok": True}
        if kind == "env":
            return {"ok": arg in os.environ, "value": os.environ.get(arg)}
        if kind == "connect":
            with socket.create_connection((arg[0], arg[1]), timeout=5) as s:
                return {"ok": True, "value": s.recv(16).decode()}
        if kind == "listdir":
            return {"ok": True, "value": sorted(os.listdir(arg))}
        if kind == "cwd":
            return {"ok": True, "value": os.getcwd()}
        if kind == "run":
            import subprocess
            done = subprocess.run(arg, input=op.get("data", "{}"), capture_output=True, text=True)
            return {"ok": done.returncode == 0, "value": done.stdout}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": False, "error": "unknown op"}

request = json.load(sys.stdin)
# Through a flow the ops arrive as a JSON string and the results leave as one.
ops = request["ops"]
results = [attempt(op) for op in (json.loads(ops) if isinstance(ops, str) else ops)]
json.dump({"results": results, "report": json.dumps(results)}, sys.stdout)
'''

ECHO = r'''
import json, sys
json.dump({"echo": json.load(sys.stdin)}, sys.stdout)
'''


def write_tool(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{PYTHON}\n{body}")
    path.chmod(0o755)
    return path


@dataclass
class ToolBox:
    tools_dir: Path
    tools: dict[str, Path]


def call_tool(
    executable: Path,
    request: dict[str, Any],
    *,
    workspace: Workspace,
    policy: SandboxPolicy,
    tools_dir: Path | None,
    base_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one tool call as the engine does: confine it, then a real subprocess in the workspace."""
    env = workspace.env(dict(os.environ) if base_env is None else base_env)
    argv, env = confine(
        policy, [str(executable)], workspace=workspace, tools_dir=tools_dir, env=env
    )
    done = subprocess.run(
        argv,
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        cwd=workspace.root,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def probe(
    toolbox: ToolBox, workspace: Workspace, policy: SandboxPolicy, *ops: dict[str, Any], **kw: Any
) -> list[dict[str, Any]]:
    out = call_tool(
        toolbox.tools["probe"],
        {"ops": list(ops)},
        workspace=workspace,
        policy=policy,
        tools_dir=toolbox.tools_dir,
        **kw,
    )
    return out["results"]


class Warnings(list[str]):
    def __call__(self, message: str) -> None:
        self.append(message)
