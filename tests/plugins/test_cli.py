"""`heddle run|validate --plugin ...` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.plugins.support import make_plugin, middleware, tool_chain_flow
from tests.support.cli import env_with, error_line, heddle
from tests.support.cli_inproc import heddle_inproc


def test_a_silent_plugin_is_given_up_after_plugin_timeout(tmp_path, capsys):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    make_plugin(tmp_path / "p", components=[middleware("Hang", "toolCall.before")],
                         code='import time\n@plugin.before("Hang", "toolCall")\ndef h(call):\n    time.sleep(60)\n')
    started = time.monotonic()
    proc = heddle("run", flow, "-t", tools, "--plugin", tmp_path / "p" / "plugin.json", "--plugin-timeout", "0.5")
    assert time.monotonic() - started < 20
    assert proc.returncode == 1
    assert error_line(proc) == ("error: plugin 'p': call 'before' was silent for more than 0.5 s (--plugin-timeout); "
                                "it was cancelled and the process killed")
    # A refused flag value: the same command in this process.
    rc, _, err = heddle_inproc(capsys, "run", flow, "-t", tools, "--plugin", tmp_path / "p" / "plugin.json",
                               "--plugin-timeout", "0")
    assert rc == 2, err


def test_protocol_heddle_streams_plugin_events_too(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    code = '''
@plugin.before("Loud", "toolCall")
def h(call):
    call.log("about to call " + call.params["tool"], level="debug")
    call.emit("seen", {"tool": call.params["tool"]})
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Loud", "toolCall.before")], code=code)
    # One run: the events on stdout, --verbose's lines on stderr.
    proc = heddle("run", flow, "-t", tools, "--plugin", plugin, "--protocol", "heddle", "--verbose")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types.index("plugin_log") < types.index("plugin_event") < types.index("tool_call")
    assert "  plugin p debug: about to call first" in proc.stderr
    assert '  plugin p event seen: {"tool":"first"}' in proc.stderr
    assert events[-1]["type"] == "flow_complete" and events[-1]["state"] == {"n": 0, "first": 1}


def test_validate_reports_plugins_with_fingerprints(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    plugin = make_plugin(tmp_path / "p", components=[middleware("Gate", "toolCall.before", "nodeError")],
                         tools=[{"name": "extra", "description": "", "inputSchema": {"type": "object"},
                                 "componentType": "X"}])
    proc = heddle("validate", flow, "-t", tools, "--plugin", plugin, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    [row] = report["plugins"]
    assert row["name"] == "p" and row["fingerprint"].startswith("sha256:")
    assert row["components"] == [{"componentType": "Gate", "kind": "middleware",
                                  "seams": ["nodeError.after", "toolCall.before"]}]
    assert row["tools"] == [{"name": "extra", "fingerprint": "sha256:" + __import__("hashlib").sha256(
        b'{"type":"object"}').hexdigest()}]


def test_a_run_without_plugins_imports_no_plugin_code(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    code = ("import sys, runpy; sys.argv = ['heddle', 'run', sys.argv[1], '-t', sys.argv[2]]\n"
            "try:\n    runpy.run_module('heddle', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            # The package itself holds the plugin host's defaults, which the flag table reads: no plugin code.
            "print(sorted(m for m in sys.modules if m.startswith('heddle.plugin') and m != 'heddle.plugin_host'),"
            " file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(flow), str(tools)], capture_output=True, text=True,
                          env=env_with(), timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr


SHELL_PLUGIN = r"""#!/bin/sh
# Answers init, then null to every before/after, until shutdown.
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"init"'*) printf '{"id":%s,"result":{"protocol":1}}\n' "$id" ;;
    *'"method":"shutdown"'*) printf '{"id":%s,"result":{}}\n' "$id"; exit 0 ;;
    *) printf '{"id":%s,"result":null}\n' "$id" ;;
  esac
done
"""


def test_the_shell_plugin_of_the_docs_lets_everything_through(tmp_path, capsys):
    flow, tools = tool_chain_flow(tmp_path)
    plugin = make_plugin(tmp_path / "noop", command=["sh", "plugin.sh"], program=SHELL_PLUGIN, capabilities=(),
                         components=[middleware("Noop", "node", "toolCall")])
    # The plugin is the real shell process; the command runs in this process.
    rc, out, err = heddle_inproc(capsys, "run", flow, "-t", tools, "--plugin", plugin, "--input", '{"n": 4}')
    assert rc == 0, err
    assert json.loads(out) == {"n": 4, "first": 5, "second": 5}
