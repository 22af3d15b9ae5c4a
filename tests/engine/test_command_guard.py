"""A command does what was declared: a value never becomes an option of its program, and the program
is the file pinned by its sha256, found on the system path and never on the caller's PATH."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import ToolInputError
from heddle.tools.commands import SYSTEM_PATH, load_commands, read_commands
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.commands import DATE, day_flow, entry, sort_entry, sort_flow, version_of, write_commands
from tests.support.flows import FlowDoc, server_tool
from tests.support.threaded_model import threaded_model


def test_a_value_that_would_be_an_option_is_refused_and_the_program_never_writes(tmp_path: Path) -> None:
    flow = sort_flow(tmp_path / "flow.json")
    commands = write_commands(tmp_path / "commands.json", sort_entry(["{path}"]))
    target = tmp_path / "written"
    proc = heddle("run", flow, "--commands", commands, "--input", f'{{"path": "--output={target}"}}')
    assert proc.returncode != 0
    line = error_line(proc)
    assert "sort_file" in line and "'path'" in line and "starts with '-'" in line, line
    assert str(target) not in line  # arguments stay out of errors
    assert not target.exists()
    # An ordinary value runs.
    (tmp_path / "lines.txt").write_text("b\na\n")
    state = state_of(heddle("run", flow, "--commands", commands, "--input",
                            f'{{"path": "{tmp_path / "lines.txt"}"}}'))
    assert state["stdout"] == "a\nb\n"


def test_validate_and_bundle_warn_of_a_lone_placeholder_that_can_become_an_option(tmp_path: Path) -> None:
    flow = sort_flow(tmp_path / "flow.json")
    lone = write_commands(tmp_path / "lone.json", sort_entry(["{path}"]))
    proc = heddle("validate", flow, "--commands", lone)
    assert proc.returncode == 0, proc.stderr
    assert "warning: " in proc.stderr and "argv[0] '{path}'" in proc.stderr and "option" in proc.stderr
    proc = heddle("bundle", flow, "--commands", lone, "-o", tmp_path / "sort.heddle")
    assert proc.returncode == 0 and "argv[0] '{path}'" in proc.stderr, proc.stderr
    (tmp_path / "sort.heddle").unlink()
    # After a literal `--`, inside `--flag={x}`, or held by a pattern that cannot start with '-': no warning.
    for argv, prop in ((["--", "{path}"], None), (["--files0-from={path}"], None),
                       (["{path}"], {"type": "string", "pattern": "^[A-Za-z0-9_/.]+$"}),
                       (["{path}"], {"type": "string", "enum": ["-r", "x"]})):
        quiet = write_commands(tmp_path / "quiet.json", sort_entry(argv, prop))
        assert read_commands(quiet).warnings == (), (argv, prop)
    assert len(read_commands(lone).warnings) == 1
    # A pattern free to start with '-' (a dash in its first class) is warned of.
    loose = write_commands(tmp_path / "loose.json", sort_entry(["{path}"], {"type": "string",
                                                                            "pattern": "^[a-z-]+$"}))
    assert len(read_commands(loose).warnings) == 1


@pytest.mark.parametrize(("argv", "prop", "value", "refused"), [
    (["{path}"], None, "-r", True),
    (["{path}"], None, "", False),  # nothing starts with '-'
    (["--", "{path}"], None, "-r", False),  # after `--` it is an operand
    (["--key={path}"], None, "-r", False),  # not at the start of its argument
    (["{path}"], {"type": "string", "pattern": "^-[a-z]$"}, "-r", False),  # the schema says it is an option
    (["{path}"], {"type": "string", "enum": ["-r", "-n"]}, "-n", False),  # a value the author wrote
    (["{path}"], {"type": "string", "pattern": "^[a-z-]+$"}, "-r", True),  # a pattern that merely lets it
    (["{path}"], {"type": "string", "pattern": "^-r|.*"}, "--output=x", True),  # an alternative lets anything
    (["{path}"], {"type": "integer"}, -5, False),  # a number is a number
    (["{path}"], {"type": "number"}, -0.5, False),
])
def test_what_admits_a_leading_dash(tmp_path: Path, argv: list[str], prop: dict[str, Any] | None, value: Any,
                                    refused: bool) -> None:
    from heddle.tools.command_run import CommandTool

    [command] = load_commands(write_commands(tmp_path / "c.json", sort_entry(argv, prop)))
    tool = CommandTool(command, None, None)  # type: ignore[arg-type]
    if refused:
        with pytest.raises(ToolInputError, match="argument 'path' starts with '-'"):
            tool.check({"path": value})
    else:
        assert tool.check({"path": value}) == {"path": value}


def test_a_look_alike_earlier_on_path_is_never_run(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    ran = tmp_path / "look-alike-ran"
    version = version_of(DATE).replace("'", "'\\''")
    (fake / "date").write_text(f"#!/bin/sh\ntouch '{ran}'\nprintf '%s\\n' '{version}'\n")
    (fake / "date").chmod(0o755)
    flow = day_flow(tmp_path / "flow.json")
    commands = write_commands(tmp_path / "commands.json", entry())
    path = f"{fake}{os.pathsep}{os.environ.get('PATH', '')}"
    state = state_of(heddle("run", flow, "--commands", commands, "--input", '{"seconds": 86400}',
                            env={"PATH": path}))
    assert state["stdout"] == "1970-01-02\n" and not ran.exists()
    [command] = load_commands(commands)
    assert command.program is not None and command.program.path in {f"{d}/date" for d in SYSTEM_PATH}


def test_a_program_changed_after_the_start_fails_closed_naming_both_digests(tmp_path: Path) -> None:
    import asyncio

    from heddle.errors import ToolError
    from heddle.tools.command_run import CommandTool

    program = tmp_path / "bin" / "date"
    program.parent.mkdir()
    shutil.copy2(DATE, program)
    [command] = load_commands(write_commands(tmp_path / "c.json", entry(executable=str(program))))
    assert command.program is not None
    tool = CommandTool(command, None, None)  # type: ignore[arg-type]
    assert asyncio.run(asyncio.to_thread(tool._program)) == str(program)
    pinned = command.program.sha256
    with program.open("ab") as fh:  # the same file, a byte longer
        fh.write(b"\0")
    with pytest.raises(ToolError) as caught:
        tool._program()
    import hashlib
    found = hashlib.sha256(program.read_bytes()).hexdigest()
    assert pinned in str(caught.value) and found in str(caught.value)
    assert "the call was not made" in str(caught.value)
    # A command whose program is in none of the system folders is refused when the file is read.
    missing = write_commands(tmp_path / "m.json", entry(executable="no-such-program-here"))
    with pytest.raises(Exception, match="is in none of /usr/local/bin:/usr/bin:/bin"):
        load_commands(missing)


def test_an_agents_model_gets_the_refusal_as_the_failed_calls_error(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "written"
    script = [{"tool_calls": [{"name": "sort_file", "arguments": {"path": f"--output={target}"}}]},
              {"content": "refused"}]
    commands = write_commands(tmp_path / "commands.json", sort_entry(["{path}"]))
    with threaded_model(script) as model:
        f = FlowDoc("ask")
        start = f.start(["query"])
        agent = f.agent("agent", model.url, tools=[server_tool("sort_file", ["path"])])
        end = f.end(["result"])
        f.control(start, agent)
        f.control(agent, end)
        flow = f.write(tmp_path / "flow.json")
        proc = heddle_here(capsys, "run", flow, "--commands", commands, "--input", '{"query": "sort"}')
        assert proc.returncode == 0, proc.stderr
        sent = json.dumps(model.requests()[1]["body"]["messages"])
    assert "starts with '-'" in sent and "'path'" in sent
    assert not target.exists()
