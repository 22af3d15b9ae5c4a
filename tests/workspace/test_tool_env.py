"""What of heddle's environment reaches a tool or a plugin, through the real `heddle run`.

heddle's own secrets never do; under `--safe` nothing does but a short fixed list, the
variables heddle sets for the call, and what `--allow-env` names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import UsageError
from heddle.secret_env import SECRET_ENV
from heddle.workspace import SandboxPolicy, check_policy
from heddle.workspace.sandbox import HEDDLE_SET_ENV, KEPT_ENV
from tests.plugins.support import make_plugin, node_type
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc, server_tool
from tests.workspace.tooling import PYTHON_READ, write_tool

ALLOW_PYTHON = [arg for path in PYTHON_READ for arg in ("--allow-read", str(path))]

# Every secret heddle holds, set the way an operator would, beside ordinary variables.
SECRETS = {name: f"secret-of-{name}" for name in sorted(SECRET_ENV)}
HOST_ENV = {**SECRETS, "FOO": "foo", "BAR": "bar", "HEDDLE_STREAM": "0", "HEDDLE_OTHER": "x"}

ENV_TOOL = r'''
import json, os, sys
json.load(sys.stdin)
json.dump({"env": json.dumps(dict(os.environ))}, sys.stdout)
'''


def tool_env(tmp_path: Path, *flags: str) -> dict[str, str]:
    """The environment a ToolNode's tool saw, run by `heddle run` with `flags`."""
    write_tool(tmp_path / "tools", "env", ENV_TOOL)
    f = FlowDoc("env")
    start = f.start()
    node = f.tool_node("env", server_tool("env", [], ["env"]))
    end = f.end(["env"])
    f.control(start, node)
    f.control(node, end)
    f.data(node, "env", end, "env")
    proc = heddle("run", f.write(tmp_path / "flow.json"), "-t", tmp_path / "tools", "--input", "{}",
                  *flags, env=HOST_ENV)
    env: dict[str, str] = json.loads(state_of(proc)["env"])
    return env


def test_safe_passes_only_the_fixed_list_heddles_settings_and_allow_env(tmp_path: Path) -> None:
    env = tool_env(tmp_path, "--safe", "--allow-env", "FOO", *ALLOW_PYTHON)
    assert env["FOO"] == "foo"
    assert {name for name in env if name.startswith("HEDDLE_")} == {n for n in HEDDLE_SET_ENV if n.startswith("HEDDLE_")}
    # Set inside the sandbox, not copied: PWD by bubblewrap's --chdir, LC_CTYPE by Python
    # itself in a C locale.
    assert set(env) - {*KEPT_ENV, *HEDDLE_SET_ENV, "FOO", "PWD", "LC_CTYPE"} == set()
    assert env["PWD"] == env["HEDDLE_WORKSPACE"]
    assert env["HOME"] == "/tmp/home" and env["TMPDIR"] == "/tmp"


def test_without_safe_heddles_secrets_are_stripped(tmp_path: Path) -> None:
    env = tool_env(tmp_path)
    assert set(SECRETS) & set(env) == set()
    # Everything else of the user's environment is the tool's, as for any program they run.
    assert env["FOO"] == "foo" and env["BAR"] == "bar" and env["HEDDLE_OTHER"] == "x"
    assert Path(env["HEDDLE_WORKSPACE"]).name.startswith("heddle-env-")


def test_allow_env_cannot_name_a_secret() -> None:
    for name in sorted(SECRET_ENV):
        with pytest.raises(UsageError) as err:
            check_policy(SandboxPolicy(safe=True, allow_env=(name,)), explicitly_set=["--allow-env"])
        assert str(err.value) == (
            f"--allow-env {name}: heddle's own secret, never passed to a tool; "
            "give the tool its value under another name"
        )


PLUGIN = '''
import json, os

@plugin.node("EnvReport")
def report(call):
    return {"env": json.dumps(sorted(os.environ))}
'''


def plugin_env(tmp_path: Path, *flags: str, inproc: tuple[pytest.CaptureFixture[str], pytest.MonkeyPatch] | None = None,
               ) -> list[str]:
    """The names in a plugin process's environment, run by `heddle run` with `flags` (with `inproc`,
    by the CLI's entry function in this process, HOST_ENV set in the environment it inherits)."""
    plugin = make_plugin(tmp_path / "envplugin", components=[node_type("EnvReport", [], ["env"])], code=PLUGIN)
    f = FlowDoc("plugin-env")
    start = f.start()
    node = f._node("EnvReport", "report", [], ["env"])
    end = f.end(["env"])
    f.control(start, node)
    f.control(node, end)
    f.data(node, "env", end, "env")
    argv = ["run", f.write(tmp_path / "flow.json"), "--plugin", plugin, "--input", "{}", *flags]
    if inproc is None:
        out = json.dumps(state_of(heddle(*argv, env=HOST_ENV)))
    else:
        capsys, monkeypatch = inproc
        for name, value in HOST_ENV.items():
            monkeypatch.setenv(name, value)
        rc, out, err = heddle_inproc(capsys, *argv)
        assert rc == 0, err
    names: list[Any] = json.loads(json.loads(out)["env"])
    return [str(n) for n in names]


@pytest.mark.parametrize("flags", [(), ("--safe",)], ids=["plain", "safe"])
def test_plugin_processes_never_get_heddles_secrets(tmp_path: Path, flags: tuple[str, ...],
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The plain run is a real `heddle` process; the --safe one the same command in this process.
    names = plugin_env(tmp_path, *flags, inproc=(capsys, monkeypatch) if flags else None)
    assert set(SECRETS) & set(names) == set()
    assert {"HEDDLE_PLUGIN_NAME", "HEDDLE_PLUGIN_DIR", "HEDDLE_PLUGIN_HOME"} <= set(names)
    assert ("FOO" in names) is not bool(flags)
