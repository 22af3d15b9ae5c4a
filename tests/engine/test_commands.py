"""Commands (`--commands FILE`): tools declared as one fixed operation of a real program, checked when
the file is read, probed for their version before every call, and kept out of telemetry."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from heddle.canonical import fingerprint
from heddle.errors import UsageError
from heddle.tools.commands import load_commands
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.commands import day_flow, entry, version_of, write_commands
from tests.support.flows import FlowDoc, server_tool
from tests.support.threaded_model import threaded_model

Capsys = pytest.CaptureFixture[str]

MKDIR = shutil.which("mkdir") or "/usr/bin/mkdir"


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


# ---------------------------------------------------------------- read and checked, nothing run


@pytest.mark.parametrize(("fields", "expected"), [
    ({"executable": "bash"}, "command 'day_of': executable 'bash' is a shell"),
    ({"executable": "/usr/bin/env"}, "command 'day_of': executable '/usr/bin/env' is a launcher"),
    ({"executable": "sudo"}, "executable 'sudo' is a launcher"),
    ({"executable": "zsh-5.9"}, "executable 'zsh-5.9' is a shell"),
    ({"executable": "date -u"}, "executable 'date -u' holds white space"),
    ({"executable": "bin/date"}, "executable 'bin/date' is a relative or unnormalised path"),
    ({"argv": ["-d", "@{secs}"]}, "argv[1] '@{secs}' names {secs}, which is not a property of its input_schema"),
    ({"argv": ["{"]}, "argv[0] '{' has a lone '{'"),
    ({"input_schema": {"type": "object", "properties": {"seconds": {"type": "integer"}}}},
     "names {seconds}, which a call may leave out; make it required or give it a default"),
    ({"input_schema": {"type": "object", "properties": {"seconds": {"type": "array"}}, "required": ["seconds"]}},
     "input_schema.properties.seconds.type is 'array'; a command's arguments are one of string, number"),
    ({"input_schema": {"type": "object", "properties": {"seconds": {"type": "object"}}, "required": ["seconds"]}},
     "input_schema.properties.seconds.type is 'object'"),
    ({"input_schema": {"type": "object", "properties": {"seconds": {"type": 7}}}},
     "input_schema['properties']['seconds']['type'] is not a valid Draft 2020-12 schema"),
    ({"input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}},
     "input_schema.$schema is 'http://json-schema.org/draft-07/schema#'; input schemas are Draft 2020-12"),
    ({"working_directory": "home"}, "working_directory is 'home'; give one of: workspace, bundle"),
    ({"output": "yaml"}, "output is 'yaml'; give one of: text, json"),
    ({"timeout_seconds": 0}, "timeout_seconds is 0; give a number of seconds above 0"),
    ({"adapter_version": 1}, "adapter_version must be a non-empty string (it is int; quote it)"),
    ({"expected_version": " 9.1"}, "expected_version starts or ends with white space"),
    ({"shell": True}, "command 'day_of': unknown field 'shell'"),
])
def test_a_command_is_refused_when_read_naming_the_file_the_command_and_the_field(
        tmp_path: Path, fields: dict[str, Any], expected: str) -> None:
    path = write_commands(tmp_path / "commands.json", entry(**fields))
    with pytest.raises(UsageError) as caught:
        load_commands(path)
    message = str(caught.value)
    assert message.startswith(f"--commands {path}: ") and expected in message, message
    assert "\n" not in message


def test_the_file_itself_is_read_exactly(tmp_path: Path) -> None:
    missing = {k: v for k, v in entry().items() if k != "version_probe"}
    cases = [
        ({"commands": [missing]}, "command 'day_of': missing field 'version_probe'"),
        ({"commands": [entry(), entry()]}, "commands[1]: name 'day_of' is also the name of an earlier command"),
        ({"commands": [], "version": 2}, "the file: unknown field 'version'"),
        ({"commands": [entry(name="two words")]}, "name 'two words' must be 1 to 64 letters"),
    ]
    for document, expected in cases:
        path = tmp_path / "c.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        with pytest.raises(UsageError, match=re.escape(expected)):
            load_commands(path)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("commands:\n  - name: a\n    name: b\n", encoding="utf-8")
    with pytest.raises(UsageError, match="line 3: the key 'name' appears twice"):
        load_commands(yaml_file)
    yaml_file.write_text("commands: [&x {name: a}, *x]\n", encoding="utf-8")
    with pytest.raises(UsageError, match="YAML aliases"):
        load_commands(yaml_file)
    yaml_file.write_text("commands:\n  - {name: a, timeout_seconds: .inf}\n", encoding="utf-8")
    with pytest.raises(UsageError, match="timeout_seconds: inf is not a finite number"):
        load_commands(yaml_file)


def test_a_commands_revision_is_the_fingerprint_of_its_configuration(tmp_path: Path) -> None:
    config = entry()
    [command] = load_commands(write_commands(tmp_path / "a.json", config))
    assert command.revision == fingerprint(config)
    assert command.input_schema_fingerprint == fingerprint(config["input_schema"])
    assert (command.name, command.description, command.expected_version) == \
        ("day_of", config["description"], config["expected_version"])
    [changed] = load_commands(write_commands(tmp_path / "b.json", entry(argv=["-u", "-d", "@{seconds}"])))
    assert changed.revision != command.revision
    # Each argv entry renders to exactly one argument, whatever the value holds.
    [spaced] = load_commands(write_commands(tmp_path / "c.json", entry(
        input_schema={"type": "object", "required": ["text", "n", "x", "on"],
                      "properties": {"text": {"type": "string"}, "n": {"type": "integer"},
                                     "x": {"type": "number"}, "on": {"type": "boolean"}}},
        argv=["{{{text}}}", "--n={n}", "{x}", "{on}"])))
    assert spaced.render({"text": "a b; rm -rf /", "n": 3.0, "x": 0.5, "on": False}) == \
        ["{a b; rm -rf /}", "--n=3", "0.5", "false"]


# ---------------------------------------------------------------- calls through the CLI
# `heddle run --commands` succeeds in a process in the first test below and refuses in one in the
# second, `heddle validate --commands` refuses in one in the third; the other runs of a state go
# through the same entry function in this process (`heddle_here`: the same lines and statuses).


def test_a_toolnode_runs_a_command_of_the_real_date_and_its_telemetry_holds_no_arguments_or_output(
        tmp_path: Path) -> None:
    flow = day_flow(tmp_path / "flow.json")
    commands = write_commands(tmp_path / "commands.json", entry())
    [command] = load_commands(commands)
    proc = heddle("run", flow, "--commands", commands, "--input", '{"seconds": 86400}', "--protocol", "heddle")
    assert proc.returncode == 0, proc.stderr
    events = events_of(proc.stdout)
    state = events[-1]["state"]
    assert state["stdout"] == "1970-01-02\n" and state["exit_code"] == 0 and state["stderr"] == ""
    ours = [e for e in events if e.get("tool") == "day_of" or e.get("node") == "day"]
    assert [e["type"] for e in ours] == ["node_start", "tool_call", "tool_result", "node_complete"]
    text = json.dumps(ours)
    assert "86400" not in text and "1970-01-02" not in text
    call, result = ours[1], ours[2]
    assert call["arguments"] == {"redacted": True, "revision": command.revision}
    assert result["ok"] is True and result["output"] == {"redacted": True, "revision": command.revision,
                                                         "exit_code": 0}
    assert result["duration_ms"] > 0


def test_a_drifted_version_fails_closed_naming_both_and_the_command_never_runs(tmp_path: Path,
                                                                               capsys: Capsys) -> None:
    real = version_of(MKDIR)
    drifted = real.replace(real.splitlines()[0], "mkdir (GNU coreutils) 0.1", 1)
    f = FlowDoc("make")
    start = f.start(["name"])
    node = f.tool_node("make", server_tool("make_dir", ["name"], [{"title": "exit_code", "type": "integer"}]))
    end = f.end(["exit_code"])
    f.control(start, node)
    f.control(node, end)
    flow = f.write(tmp_path / "flow.json")
    made = {"name": "make_dir", "description": "Makes one folder beside the commands file.",
            "input_schema": {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
                             "required": ["name"]},
            "executable": MKDIR, "version_probe": ["--version"], "expected_version": drifted,
            "argv": ["--", "{name}"], "timeout_seconds": 10, "working_directory": "bundle", "adapter_version": "1",
            "output": "text"}
    commands = write_commands(tmp_path / "commands.json", made)
    proc = heddle("run", flow, "--commands", commands, "--input", '{"name": "made"}')
    assert proc.returncode != 0
    line = error_line(proc)
    assert "mkdir (GNU coreutils) 0.1" in line and real.splitlines()[0] in line, line
    assert "the call was not made" in line
    assert not (tmp_path / "made").exists()
    # With the version it reports, it runs where it says: beside the commands file.
    write_commands(commands, {**made, "expected_version": real})
    assert state_of(heddle_here(capsys, "run", flow, "--commands", commands, "--input", '{"name": "made"}'))[
        "exit_code"] == 0
    assert (tmp_path / "made").is_dir()


def test_arguments_are_checked_against_the_schema_and_never_quoted_back(tmp_path: Path) -> None:
    from heddle.errors import ToolInputError
    from heddle.tools.command_run import CommandTool
    from heddle.tools.commands import read_commands

    commands = read_commands(write_commands(tmp_path / "c.json", entry(input_schema={
        "type": "object", "required": ["seconds"],
        "properties": {"seconds": {"type": "integer", "minimum": 0}, "zone": {"type": "string", "default": "UTC"}}})))
    tool = CommandTool(commands.commands["day_of"], commands, ctx=None)  # type: ignore[arg-type]
    assert tool.check({"seconds": 5}) == {"seconds": 5, "zone": "UTC"}
    for arguments, expected in (({"seconds": -86400}, "seconds does not satisfy minimum 0"),
                                ({"seconds": "86400"}, 'seconds does not satisfy type "integer"'),
                                ({"seconds": 1, "secret": "hunter2"}, "it declares: seconds, zone"),
                                ({"seconds": 1, "zone": "a\x00b"}, "argument 'zone' holds a NUL character")):
        with pytest.raises(ToolInputError, match=re.escape(expected)) as caught:
            tool.check(arguments)
        assert "86400" not in str(caught.value) and "hunter2" not in str(caught.value)


def test_a_command_takes_a_tools_name_only_as_an_error_naming_both(tmp_path: Path, capsys: Capsys) -> None:
    flow = day_flow(tmp_path / "flow.json")
    commands = write_commands(tmp_path / "commands.json", entry())
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "day_of.sh").write_text("#!/bin/sh\necho '{}'\n", encoding="utf-8")
    (tools / "day_of.sh").chmod(0o755)
    proc = heddle("validate", flow, "--commands", commands, "--tools-dir", tools)
    assert proc.returncode == 2
    line = error_line(proc)
    assert f"--commands {commands}: command 'day_of' has the name of the tool {tools.resolve() / 'day_of.sh'}" in line
    report = json.loads(heddle_here(capsys, "validate", flow, "--commands", commands, "--json").stdout)
    assert report["valid"] and report["commands"][0]["revision"] == load_commands(commands)[0].revision
    assert report["tools"][0]["command"] == report["commands"][0]["revision"]


def test_an_agent_calls_a_command_and_the_model_gets_its_output(tmp_path: Path, capsys: Capsys) -> None:
    script = [{"tool_calls": [{"name": "day_of", "arguments": {"seconds": 172800}}]}, {"content": "done"}]
    commands = write_commands(tmp_path / "commands.json", entry())
    with threaded_model(script) as model:
        f = FlowDoc("ask")
        start = f.start(["query"])
        agent = f.agent("agent", model.url, tools=[server_tool("day_of", [{"title": "seconds", "type": "integer"}])])
        end = f.end(["result"])
        f.control(start, agent)
        f.control(agent, end)
        flow = f.write(tmp_path / "flow.json")
        proc = heddle_here(capsys, "run", flow, "--commands", commands, "--input", '{"query": "when?"}',
                           "--protocol", "heddle")
        assert proc.returncode == 0, proc.stderr
        sent = json.dumps(model.requests()[1]["body"]["messages"])
    assert "1970-01-03" in sent
    tool_events = [e for e in events_of(proc.stdout) if e["type"] in ("tool_call", "tool_result")]
    assert len(tool_events) == 2 and "1970-01-03" not in json.dumps(tool_events)
    assert "172800" not in json.dumps(tool_events)


def one_tool_flow(path: Path, tool: str, inputs: list[str]) -> Path:
    f = FlowDoc(tool)
    start = f.start(inputs)
    outputs = [{"title": "exit_code", "type": "integer"}, "stdout", "stderr"]
    node = f.tool_node(tool, server_tool(tool, inputs, outputs))
    end = f.end(outputs)
    f.control(start, node)
    f.control(node, end)
    return f.write(path)


def coreutil(name: str, program: str, argv: list[str], where: str, schema: dict[str, Any]) -> dict[str, Any]:
    executable = shutil.which(program) or f"/usr/bin/{program}"
    return {"name": name, "description": f"runs {program}", "input_schema": schema, "executable": program,
            "version_probe": ["--version"], "expected_version": version_of(executable), "argv": argv,
            "timeout_seconds": 10, "working_directory": where, "adapter_version": "1", "output": "text"}


def test_a_command_gets_an_empty_environment_and_under_safe_the_tools_sandbox(
        tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    no_args = {"type": "object", "properties": {}}
    named = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    commands = write_commands(tmp_path / "commands.json",
                              coreutil("show_env", "printenv", [], "workspace", no_args),
                              coreutil("make_dir", "mkdir", ["--", "{name}"], "bundle", named))
    keep = tmp_path / "ws"
    # The environment of the run that starts the command holds a secret and a setting of its own.
    monkeypatch.setenv("HEDDLE_AUTH_TOKEN", "s3cret")
    monkeypatch.setenv("SOME_SETTING", "x")
    state = state_of(heddle_here(capsys, "run", one_tool_flow(tmp_path / "env.json", "show_env", []), "--commands",
                                 commands, "--workspace", keep))
    assert state["stdout"] == f"HEDDLE_WORKSPACE={keep / 'show_env'}\n", state
    # In a session its call is a step: it gets the step's idempotency key too.
    state = state_of(heddle_here(capsys, "run", tmp_path / "env.json", "--commands", commands, "--workspace", keep,
                                 "--session", "s", "--session-db", tmp_path / "s.db", "--durable"))
    shown = dict(line.split("=", 1) for line in state["stdout"].splitlines())
    assert set(shown) == {"HEDDLE_WORKSPACE", "HEDDLE_IDEMPOTENCY_KEY"}, state
    assert re.fullmatch("hk-[0-9a-f]{40}", shown["HEDDLE_IDEMPOTENCY_KEY"]), state
    # Under --safe it runs in the sandbox a tool gets: its bundle folder is there, read-only.
    proc = heddle_here(capsys, "run", one_tool_flow(tmp_path / "mk.json", "make_dir", ["name"]), "--commands",
                       commands, "--safe", "--input", '{"name": "made"}')
    state = state_of(proc)
    assert state["exit_code"] == 1 and "Read-only file system" in state["stderr"], state
    assert not (tmp_path / "made").exists()


def test_a_command_past_its_timeout_is_killed_naming_the_limit(tmp_path: Path) -> None:
    import heddle
    from heddle.errors import ToolError

    seconds = {"type": "object", "properties": {"seconds": {"type": "integer"}}, "required": ["seconds"]}
    commands = write_commands(tmp_path / "commands.json",
                              {**coreutil("nap", "sleep", ["{seconds}"], "workspace", seconds), "timeout_seconds": 0.2})
    flow = one_tool_flow(tmp_path / "nap.json", "nap", [{"title": "seconds", "type": "integer"}])
    with pytest.raises(ToolError, match=re.escape("tool 'nap': timed out after 0.2 s and was killed (raise its "
                                                  f"timeout_seconds in --commands {commands} if it needs longer)")):
        heddle.run(flow, inputs={"seconds": 600}, commands=commands)


def test_a_flow_must_name_a_command_as_a_server_tool_whose_inputs_it_takes(
        tmp_path: Path, capsys: Capsys) -> None:
    commands = write_commands(tmp_path / "commands.json", entry())
    f = FlowDoc("odd")
    start = f.start(["when"])
    node = f.tool_node("day", server_tool("day_of", ["when"], ["stdout"]))
    end = f.end(["stdout"])
    f.control(start, node)
    f.control(node, end)
    proc = heddle_here(capsys, "validate", f.write(tmp_path / "odd.json"), "--commands", commands, "--json")
    problems = json.loads(proc.stdout)["problems"]
    assert proc.returncode == 2
    assert any("ServerTool 'day_of': input 'when' is not a property of the input_schema of command 'day_of'" in p
               for p in problems), problems
    assert any("does not declare the input 'seconds', which command 'day_of'" in p for p in problems), problems
