"""heddle-server reads durations as `heddle run` does (`300ms`, `30s`, `5m`); a plain number is
still milliseconds, with a note, and its messages keep naming limits in milliseconds."""

from __future__ import annotations

import pytest

from heddle.server.cli import config_from
from tests.server.flows import one_tool_flow, write_tools
from tests.support.server_thread import threaded_server

NAP = "#!/bin/sh\nexec sleep 60\n"


def _config(*argv: str):
    return config_from(list(argv), {})


def test_a_duration_with_a_unit_and_plain_milliseconds_are_the_same_setting(capsys):
    with_unit = _config("--timeout", "500ms", "--tool-timeout", "2s", "--drain-timeout", "1m",
                        "--header-timeout", "1s")
    assert capsys.readouterr().err == ""
    plain = _config("--timeout", "500", "--tool-timeout", "2000", "--drain-timeout", "60000",
                    "--header-timeout", "1000")
    notes = capsys.readouterr().err.splitlines()
    assert with_unit == plain
    assert (plain.settings.timeout, plain.settings.tool_timeout, plain.drain_timeout, plain.header_timeout) == \
        (0.5, 2.0, 60.0, 1.0)
    assert plain.given == {"timeout", "tool_timeout"}
    assert len(notes) == 4
    assert ("note: --timeout 500: a plain number is read as milliseconds, which is deprecated; "
            "write it with its unit: --timeout 500ms to keep this meaning, or --timeout 8m20s for seconds") in notes


def test_the_note_for_a_plain_number_meant_as_seconds_does_not_only_suggest_milliseconds(capsys):
    config = _config("--drain-timeout", "30")
    assert config.drain_timeout == 0.03  # today's unit is kept
    note = capsys.readouterr().err.strip()
    assert note == ("note: --drain-timeout 30: a plain number is read as milliseconds, which is deprecated; write "
                    "it with its unit: --drain-timeout 30ms to keep this meaning, or --drain-timeout 30s for seconds")


def test_what_was_not_given_keeps_the_tables_default():
    config = _config()
    assert (config.settings.timeout, config.settings.max_tool_rounds, config.port, config.drain_timeout) == \
        (300.0, 10, 4319, 30.0)
    assert config.given == frozenset()
    # Given at the default's value still counts as given, so it beats a bundle's proposal.
    assert _config("--max-tool-rounds", "10").given == {"max_tool_rounds"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--timeout", "0ms"], "--timeout 0ms: must be at least 1ms"),
    (["--max-tool-rounds", "unlimited", "--max-iterations", "0"], "--max-iterations 0: must be at least 1"),
])
def test_a_value_out_of_range_names_the_flag_as_given(argv, message):
    from heddle.errors import UsageError

    with pytest.raises(UsageError) as caught:
        _config(*argv)
    assert caught.value.message == message


def test_a_served_run_times_out_alike_whichever_way_the_limit_is_written(tmp_path, capsys):
    tools = write_tools(tmp_path / "tools", {"nap": NAP})
    flows = tmp_path / "flows"
    flows.mkdir()
    one_tool_flow("nap", "nap").write(flows / "nap.json")
    # Served from a thread by the command's own entry; what it prints is this test's captured stderr.
    capsys.readouterr()
    with threaded_server(tmp_path, "--flows-root", flows, "--tools-dir", tools, "--tool-timeout", "300ms",
                         "--timeout", "1m") as server:
        with server.client() as client:
            limits = client.get("/v1/capabilities").json()["limits"]
            assert (limits["timeoutMs"], limits["toolTimeoutMs"]) == (60000, 300)
            response = client.post("/v1/runs", json={"flowPath": "nap.json", "inputs": {"x": 1}})
        assert response.status_code == 500
        # The same message as with `--tool-timeout 300` (tests/server/test_units.py).
        assert response.json()["error"]["message"] == (
            "tool 'nap': timed out after 300 ms and was killed (raise --tool-timeout if it needs longer)")
    assert "note:" not in capsys.readouterr().err
