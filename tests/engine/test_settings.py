"""Every run setting is defined once (heddle.settings): both shells' flags are generated from it,
durations read the same way on both, and one function settles a bundle's proposals."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable

import pytest
import typer

from heddle.cli import app
from heddle.errors import UsageError
from heddle.server.cli import command as server_command
from heddle.server.config import server_settings
from heddle.settings import (
    SETTINGS,
    SHELL_SETTINGS,
    RunSettings,
    explicit,
    format_duration,
    parse_duration,
    settle,
)
from tests.support.cli import env_with, error_line, heddle
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_script


@pytest.mark.parametrize(("text", "seconds"), [
    ("30s", 30.0), ("500ms", 0.5), ("5m", 300.0), ("1h", 3600.0), ("1m30s", 90.0), ("1.5s", 1.5), (".5s", 0.5),
    ("2h0m1s", 7201.0), (" 10S ", 10.0),
])
def test_durations_with_a_unit_read_the_same_on_both_surfaces(text, seconds):
    assert parse_duration(text, plain="s") == (seconds, False)
    assert parse_duration(text, plain="ms") == (seconds, False)


def test_a_plain_number_keeps_the_surfaces_old_unit():
    assert parse_duration("0.5", plain="s") == (0.5, True)
    assert parse_duration("500", plain="ms") == (0.5, True)
    # The server always took whole milliseconds.
    with pytest.raises(ValueError, match=r"'1\.5' is not a whole number of milliseconds"):
        parse_duration("1.5", plain="ms")


@pytest.mark.parametrize("text", ["", "s", "5 m", "-1s", "1d", "1e3", "inf", "nan", "5m30", "ms5"])
def test_anything_else_is_refused_naming_the_forms(text):
    with pytest.raises(ValueError, match="30s, 500ms, 5m"):
        parse_duration(text, plain="s")


@pytest.mark.parametrize("seconds", [300.0, 30.0, 0.5, 90.0, 3600.0, 0.001, 1.5, 3661.5, 0.0005])
def test_a_formatted_duration_reads_back_exactly(seconds):
    assert parse_duration(format_duration(seconds), plain="s")[0] == pytest.approx(seconds)


def test_formatting_is_the_short_form():
    assert [format_duration(s) for s in (300, 30, 0.5, 90, 3600)] == ["5m", "30s", "500ms", "1m30s", "1h"]


def _cli_options(command: str) -> dict[str, object]:
    group = typer.main.get_command(app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    return {opt: p for p in params for opt in p.opts}


def _server_options() -> dict[str, object]:
    return {opt: p for p in server_command().params for opt in p.opts}


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


HELPS = (("--help",), ("run", "--help"), ("validate", "--help"), ("bundle", "--help"), ("init", "--help"))


def _printed(main: Callable[..., object], *args: object) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(*args)
    return out.getvalue()


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], str]:
    """Each help text, printed once for the module's tests (they only read it): `heddle run --help` by a
    real `heddle`, the others by the same entry function in this process (the same text but for the
    program's name; `heddle --help` and `heddle-server --help` as processes are tests/bundle/test_cli.py's
    and tests/server/test_startup.py's)."""
    from heddle.cli.errors import run_app

    return {args: heddle(*args).stdout if args == ("run", "--help") else _printed(run_app, app, list(args))
            for args in HELPS}


def test_every_shared_setting_is_in_both_helps_with_one_default(helps: dict[tuple[str, ...], str]) -> None:
    from heddle.server.cli import run

    cli, server = _cli_options("run"), _server_options()
    cli_help = _normal(helps[("run", "--help")])
    server_help = _normal(_printed(run, ["--help"], env_with()))
    for spec in (*SETTINGS, *SHELL_SETTINGS):
        if spec.flag is None:
            continue
        flag = spec.flag.split("/")[0]
        shown = spec.show_default()
        default = f"[default: {shown}]"
        if spec.cli:
            assert flag in cli, flag
            assert f"{flag} {spec.metavar}" in cli_help if spec.metavar else flag in cli_help, flag
            if shown is not None:
                assert default in _normal(cli[flag].help), flag  # type: ignore[attr-defined]
        if spec.server:
            assert flag in server, flag
            assert f"{flag} {spec.metavar}" in server_help if spec.metavar else flag in server_help, flag
            if shown is not None:
                assert default in _normal(server[flag].help), flag  # type: ignore[attr-defined]
        if spec.kind == "duration":
            assert "plain numbers are seconds" in cli[flag].help  # type: ignore[attr-defined]
            if spec.server:
                assert "plain numbers are milliseconds" in server[flag].help  # type: ignore[attr-defined]
    for spec in server_settings():
        if spec.kind == "duration":
            assert "plain numbers are milliseconds" in server[spec.flag].help  # type: ignore[attr-defined,index]
    assert "[default: 5m]" in cli_help and "[default: 5m]" in server_help


def test_help_shows_no_python_types_and_no_cut_summaries(helps: dict[tuple[str, ...], str]) -> None:
    for args in HELPS:
        text = helps[args]
        assert "Usage: " in text and "--help" in text, (args, text)
        assert not re.search(r"<(str|int|float|path|bool|list\[\w+\]|\w+ range)>|INTEGER|FLOAT|RANGE|x>=", text), \
            (args, text)
        assert "..." not in text.replace("COMMAND [ARGS]...", ""), (args, text)


def test_the_command_line_disposes_what_the_bundle_proposes():
    proposed = {"max_tool_rounds": "unlimited"}
    assert settle(RunSettings(), proposed).max_tool_rounds is None
    assert settle(RunSettings(), {"max_tool_rounds": 3}).max_tool_rounds == 3
    assert settle(RunSettings(), {"max_tool_rounds": None}).max_tool_rounds == 10
    # Given explicitly, even at the default's value, the flag wins.
    assert settle(RunSettings(), proposed, given={"max_tool_rounds"}).max_tool_rounds == 10
    assert settle(RunSettings(max_tool_rounds=7), proposed).max_tool_rounds == 7
    assert settle(RunSettings(max_tool_rounds=None), {"max_tool_rounds": 3}).max_tool_rounds is None
    with pytest.raises(UsageError, match="does not know"):
        settle(RunSettings(), {"max_widgets": 3})


def test_a_bundles_own_mounts_and_plugins_come_first(tmp_path):
    from heddle.workspace.mounts import parse_mount

    sealed = parse_mount(f"{tmp_path}:/sealed")
    settled = settle(RunSettings(mounts=(f"{tmp_path}:/given",), plugins=(tmp_path / "b.json",)),
                     mounts=[sealed], plugins=[tmp_path / "a.json"])
    assert settled.mounts[0] == sealed and settled.plugins == (tmp_path / "a.json", tmp_path / "b.json")
    assert [str(m.dest) for m in settled.run_options().workspace.mounts] == ["/sealed", "/given"]


def test_run_settings_refuse_what_no_flag_would_take():
    with pytest.raises(UsageError, match="--max-iterations 0: must be at least 1"):
        RunSettings(max_iterations=0)
    with pytest.raises(UsageError, match="--tool-timeout 0: must be at least 1ms"):
        RunSettings(tool_timeout=0)
    with pytest.raises(UsageError, match="--mount 'a:b:c:d'"):
        RunSettings(mounts=["a:b:c:d"])
    assert explicit(RunSettings(timeout=1.0, safe=True)) == {"timeout", "safe"}


def test_run_options_carry_every_setting():
    from heddle.settings import SERVER

    settings = RunSettings(max_iterations=5, max_tool_rounds=None, timeout=1.0, tool_timeout=2.0, stream=False,
                           mount_tools=False, mount_max_entries=7, mount_max_bytes=8, safe=True, sandbox="bubblewrap",
                           deny_net=True, allow_env=["HOME"], model_timeout=3.0, model_retries=0)
    options = settings.run_options(surface=SERVER)
    assert (options.max_iterations, options.max_tool_rounds, options.timeout, options.tool_timeout,
            options.stream, options.model_timeout, options.model_retries) == (5, None, 1.0, 2.0, False, 3.0, 0)
    assert (options.workspace.mount_tools, options.workspace.max_entries, options.workspace.max_bytes) == \
        (False, 7, 8)
    assert (options.sandbox.safe, options.sandbox.backend, options.sandbox.deny_net, options.sandbox.allow_env) == \
        (True, "bubblewrap", True, ("HOME",))
    assert options.surface is SERVER and settings.sandbox_flags == ("--sandbox",)


def test_cli_durations_with_a_unit_and_plain_seconds_behave_the_same(tmp_path, capsys):
    tools = tmp_path / "tools"
    write_script(tools, "nap.sh", "#!/bin/sh\nexec sleep 30\n")
    f = FlowDoc()
    s, t, e = f.start(["x"]), f.tool_node("nap", server_tool("nap")), f.end(["x"])
    f.control(s, t)
    f.control(t, e)
    flow = f.write(tmp_path / "f.json")
    expected = "error: tool 'nap': timed out after 0.3 s and was killed (raise --tool-timeout if it needs longer)"
    with_unit = heddle("run", flow, "-t", tools, "--input", '{"x": "1"}', "--tool-timeout", "300ms")
    # The plain number through the same entry function in this process (the one above is a process).
    plain = heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"x": "1"}', "--tool-timeout", "0.3")
    assert (with_unit.returncode, error_line(with_unit)) == (plain.returncode, error_line(plain)) == (1, expected)
    assert "note:" not in with_unit.stderr
    assert ("note: --tool-timeout 0.3: a plain number is read as seconds, which is deprecated; write it with its "
            "unit: --tool-timeout 300ms") in plain.stderr
    # The refused values: the same command in this process.
    rc, _, err = heddle_inproc(capsys, "run", flow, "-t", tools, "--tool-timeout", "soon")
    assert rc == 2 and err.splitlines()[-1].startswith("error: --tool-timeout: 'soon' is not a duration"), err
    rc, _, err = heddle_inproc(capsys, "run", flow, "-t", tools, "--tool-timeout", "0s")
    assert rc == 2 and err.splitlines()[-1] == "error: --tool-timeout 0s: must be at least 1ms", err
