"""The plugin examples, end to end through the `heddle` command and real plugin processes.

`heddle run --plugin` as a real process, for the retry policy and the encoder as their README and
docs/plugins.md show them, is tests/docs/test_shell_blocks.py's (every shell block of those pages runs
as written); here every example runs the same command through its entry function in this process
(`heddle_here`), their plugins still real processes, and what it prints is checked.
`heddle validate --plugin` as a process is tests/plugins/test_cli.py's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import heddle as library
from tests.support.cli import state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.inproc import check_doc
from tests.support.threaded_model import threaded_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"


def copy_example(name: str, tmp_path: Path, model_url: str | None = None) -> Path:
    root = tmp_path / name
    shutil.copytree(EXAMPLES / name, root)
    if model_url is not None:
        flow = root / "flow.yaml"
        flow.write_text(flow.read_text().replace("http://127.0.0.1:4320/v1", model_url))
    return root


def test_retry_policy_runs_a_flaky_tool_again(tmp_path, capsys):
    root = copy_example("retry-flaky", tmp_path)
    args = ["run", root / "flow.yaml", "-t", root / "tools", "--mount", f"{root / 'state'}:state:rw",
            "--plugin", root / "plugin" / "plugin.json", "--input", '{"symbol": "ACME"}']
    # In-process, its plugin a real process (a `heddle` process runs this command as examples/plugins/README.md
    # shows it: tests/docs/test_shell_blocks.py).
    proc = heddle_here(capsys, *args)
    assert state_of(proc) == {"symbol": "ACME", "price": 42, "calls": 3}
    retried = [line for line in proc.stderr.splitlines() if "retried node 'fetch'" in line]
    assert len(retried) == 2 and retried[0].startswith("warning: plugin 'retry-policy' (RetryPolicy) retried node "
                                                       "'fetch' (attempt 2 of 3, after 0.2 s)")
    (root / "state" / "calls").unlink()
    # The same run through the library: --max-node-attempts is one of the shared settings.
    settings = library.RunSettings(mounts=(f"{root / 'state'}:state:rw",), plugins=(root / "plugin" / "plugin.json",),
                                   max_node_attempts=2)
    with pytest.raises(library.HeddleError) as failed:
        library.run(root / "flow.yaml", inputs={"symbol": "ACME"}, tools_dir=root / "tools", settings=settings)
    assert failed.value.exit_code == 1
    assert f"error: {failed.value.message}" == ("error: tool 'fetch_quote': exited with status 75: quote service "
                                                "unavailable (call 2), try again")


def test_approval_gate_refuses_a_dangerous_call_and_the_model_sees_why(tmp_path, capsys):
    script = EXAMPLES / "approval-gate" / "model.yaml"
    with threaded_model(script) as model:
        root = copy_example("approval-gate", tmp_path, model.url)
        proc = heddle_here(capsys, "run", root / "flow.yaml", "-t", root / "tools", "--plugin",
                           root / "plugin" / "plugin.json", "--input", '{"request": "free some disk space"}',
                           "--protocol", "heddle")
        requests = model.requests()
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    refused = next(m for m in requests[1]["body"]["messages"] if m["role"] == "tool")["content"]
    assert "the call was rejected by plugin 'approval-gate' (ApprovalGate): run_shell command='rm -rf build' " \
           "needs a person's approval because it deletes or changes the system" in refused
    ran = [e["output"]["command"] for e in events if e["type"] == "tool_result" and e["ok"]]
    assert ran == ["du -sh build"]
    asked = [e for e in events if e["type"] == "plugin_event"]
    assert [(e["plugin"], e["name"], e["data"]["value"]) for e in asked] == [("approval-gate", "approval_needed",
                                                                            "rm -rf build")]
    assert events[-1]["type"] == "flow_complete" and "needs your approval" in events[-1]["state"]["result"]


def test_the_operator_can_approve_a_call(tmp_path):
    script = EXAMPLES / "approval-gate" / "model.yaml"
    with threaded_model(script) as model:
        root = copy_example("approval-gate", tmp_path, model.url)
        # The plugin's settings through the library; `--plugin-config` on the command line is the
        # audit-log and encoder tests'.
        settings = library.RunSettings(plugins=(root / "plugin" / "plugin.json",),
                                       plugin_configs=('ApprovalGate={"approved": ["rm -rf build"]}',))
        state = library.run(root / "flow.yaml", inputs={"request": "free some disk space"}, tools_dir=root / "tools",
                            settings=settings).state
        first_result = next(m for m in model.requests()[1]["body"]["messages"] if m["role"] == "tool")["content"]
    assert json.loads(first_result)["command"] == "rm -rf build" and state["result"]


def test_audit_log_in_javascript_keeps_a_hash_chain(tmp_path, capsys):
    root = copy_example("audit-log", tmp_path)
    log = tmp_path / "audit.jsonl"
    args = ["run", root / "flow.yaml", "-t", root / "tools", "--plugin", root / "plugin" / "plugin.json",
            "--plugin-config", json.dumps({"path": str(log)}).join(["AuditLog=", ""]),
            "--input", '{"title": "Hello, Heddle World"}']
    assert state_of(heddle_here(capsys, *args)) == {"title": "Hello, Heddle World", "slug": "hello-heddle-world",
                                                    "words": 3}
    # A second run appends to the same chain; the library starts the same plugin process.
    settings = library.RunSettings(plugins=(root / "plugin" / "plugin.json",),
                                   plugin_configs=(json.dumps({"path": str(log)}).join(["AuditLog=", ""]),))
    again = library.run(root / "flow.yaml", inputs={"title": "Hello, Heddle World"}, tools_dir=root / "tools",
                        settings=settings)
    assert again.state["words"] == 3
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["node"], r["phase"]) for r in records[:6]] == [
        ("start", "before"), ("start", "after"), ("slug", "before"), ("slug", "after"), ("count", "before"),
        ("count", "after")]
    assert len(records) == 12 and len({r["run"] for r in records}) == 2
    verify = ["node", str(root / "plugin" / "audit.js"), "--verify", str(log)]
    checked = subprocess.run(verify, capture_output=True, text=True, check=False)
    assert checked.returncode == 0 and "12 records, chain intact" in checked.stdout
    lines = log.read_text().splitlines()
    lines[3] = lines[3].replace('"slug"', '"sluggish"')
    log.write_text("\n".join(lines) + "\n")
    checked = subprocess.run(verify, capture_output=True, text=True, check=False)
    assert checked.returncode == 1 and "line 5 does not follow line 4" in checked.stderr


def test_a_custom_node_type_routes_by_its_branches(tmp_path, capsys):
    root = EXAMPLES / "custom-node"
    base = ["run", root / "flow.yaml", "-t", root / "tools", "--plugin", root / "plugin" / "plugin.json"]
    short = state_of(heddle_here(capsys, *base, "--input", '{"text": "Short. Sweet."}'))
    assert short == {"text": "Short. Sweet.", "words": 2, "sentences": 2, "reading_seconds": 1}
    text = "This text is long enough to take the long branch of the flow, and so it is shortened by a tool."
    # The other branch, with the node's settings, through the library (the same plugin process).
    settings = library.RunSettings(plugins=(root / "plugin" / "plugin.json",),
                                   plugin_configs=('TextStats={"words_per_minute": 60}',))
    long = library.run(root / "flow.yaml", inputs={"text": text}, tools_dir=root / "tools", settings=settings).state
    assert long["summary"] == "This text is long enough to take the ..." and long["reading_seconds"] == 21
    proc = heddle_here(capsys, "validate", root / "flow.yaml", "-t", root / "tools", "--plugin",
                       root / "plugin" / "plugin.json")
    assert proc.returncode == 0 and "1 TextStats" in proc.stdout
    assert "plugin    text-stats 1.0.0: TextStats (node)" in proc.stdout
    # Without the plugin the type is unknown: the document check, in-process.
    code, line = check_doc(root / "flow.yaml", root / "tools")
    assert code == 2 and "unknown component_type 'TextStats'" in line


def test_an_encoder_renders_the_run_as_markdown(tmp_path, capsys):
    root = EXAMPLES / "custom-node"
    text = "This text is long enough to take the long branch of the flow, and so it is shortened by a tool."
    # In-process, its plugins real processes (a `heddle` process renders this example as Markdown as
    # docs/plugins.md shows it: tests/docs/test_shell_blocks.py).
    proc = heddle_here(capsys, "run", root / "flow.yaml", "-t", root / "tools", "--plugin",
                       root / "plugin" / "plugin.json", "--plugin", EXAMPLES / "markdown-encoder" / "plugin" /
                       "plugin.json", "--protocol", "markdown", "--plugin-config",
                       'MarkdownTranscript={"timings": false}', "--input", json.dumps({"text": text}))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("# Run of `custom-node`\n\nInput: `{\"text\": ")
    assert "## 1. stats (TextStats)" in out and "Done, left by `long`: `{\"words\": 21" in out
    assert "- tool `shorten` called with" in out and "## 2. shorten (ToolNode)" in out
    assert out.rstrip().endswith("```") and '"summary": "This text is long enough to take the ..."' in out
    assert " ms)" not in out
    # A failed run, rendered by the same encoder process: the same command in this process.
    rc, failed_out, _ = heddle_inproc(capsys, "run", root / "flow.yaml", "-t", root / "tools", "--plugin",
                                      root / "plugin" / "plugin.json", "--plugin",
                                      EXAMPLES / "markdown-encoder" / "plugin" / "plugin.json",
                                      "--protocol", "markdown", "--input", '{"txt": "typo"}')
    assert rc == 2 and failed_out.rstrip().endswith(
        "**The run failed:** the flow needs input 'text' (declared by StartNode 'start'); pass it with --input "
        "'{\"text\": ...}'")
