"""`heddle-server` and `heddle run` build their flags from one table (heddle.settings, with the
server's own settings in heddle.server.config), with one reader: the same spellings, help, units,
completion and did-you-mean on both shells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from heddle.server.cli import command, config_from, run
from heddle.server.config import server_settings
from heddle.settings import SETTINGS, Setting
from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.support.server_thread import threaded_server

# The few options a shell has beside the table's.
SHELL_OWN = {"quiet", "verbose", "version", "install_completion", "show_completion"}


def _options(cmd: Any) -> dict[str, Any]:
    return {p.name: p for p in cmd.params if p.param_type_name == "option"}


def _served() -> list[Setting]:
    return [s for s in (*server_settings(), *SETTINGS) if s.server and s.flag is not None]


def test_the_servers_flags_and_heddle_runs_shared_flags_come_from_one_table() -> None:
    from heddle.cli.root import load_command

    server, heddle_run = _options(command()), _options(load_command("run"))
    # Nothing of the server's is written beside the table: a setting added there is a flag here.
    assert set(server) == {s.name for s in _served()} | SHELL_OWN
    shared = [s for s in _served() if s.name in heddle_run]
    assert {s.name for s in SETTINGS if s.cli and s.server and s.flag} <= {s.name for s in shared}
    assert {"timeout", "tool_timeout", "max_response_bytes", "tools_dir", "trust", "transfer_timeout",
            "log_level"} <= {s.name for s in shared}
    for spec in shared:
        ours, theirs = server[spec.name], heddle_run[spec.name]
        assert (ours.opts, ours.secondary_opts, ours.metavar, ours.multiple, ours.is_flag) == \
            (theirs.opts, theirs.secondary_opts, theirs.metavar, theirs.multiple, theirs.is_flag), spec.name
        # The help is the table's; only the unit a plain number of a duration is read in differs.
        assert ours.help == theirs.help.replace("(plain numbers are seconds)", "(plain numbers are milliseconds)")
    for name in ("quiet", "verbose"):
        assert server[name].opts == heddle_run[name].opts


@pytest.mark.parametrize("spec", [s for s in _served() if s.kind in ("duration", "size")], ids=lambda s: s.flag)
def test_every_duration_and_size_flag_takes_its_units(spec: Setting, capsys: pytest.CaptureFixture[str]) -> None:
    assert spec.flag is not None
    forms = {"30s": 30.0, "500ms": 0.5, "5m": 300.0} if spec.kind == "duration" else \
        {"64MiB": 64 << 20, "400MB": 400_000_000}
    for text, expected in forms.items():
        if spec.minimum is not None and expected < spec.minimum:
            continue
        config = config_from([spec.flag, text], {})
        got = getattr(config.settings, spec.name) if spec.name in config.given else getattr(config, spec.name)
        assert got == expected, (spec.flag, text)
    assert capsys.readouterr().err == ""  # with a unit, no note


def test_a_mistyped_flag_is_refused_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--prot", "0"], {}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: No such option: --prot")
    assert "--port" in err and err.rstrip().endswith("; see heddle-server --help")


def test_quiet_drops_the_notes_and_verbose_says_what_is_served(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    config_from(["--timeout", "500"], {})
    assert capsys.readouterr().err.startswith("note: --timeout 500: a plain number is read as milliseconds")
    assert config_from(["-q", "--timeout", "500"], {}).settings.timeout == 0.5
    assert capsys.readouterr().err == ""
    assert run(["-q", "-v"], {}) == 2
    assert capsys.readouterr().err == "error: give --quiet or --verbose, not both\n"
    tools = write_tools(tmp_path / "tools", {"echo": ECHO})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("echo", "echo").write(flows / "echo.json")
    capsys.readouterr()
    with threaded_server(tmp_path, "-v", "--tools-dir", tools, "--flows-root", flows, "--max-concurrent", "3"):
        pass
    assert "heddle-server: answering on ag-ui, runs; up to 3 runs at once (--max-concurrent); sessions: none" \
        in capsys.readouterr().err
