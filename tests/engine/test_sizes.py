"""Sizes read the same on both shells: `64MiB`, `400MB`, `16KiB` (binary and decimal units, read
exactly), and a plain number is bytes, as it always was."""

from __future__ import annotations

import pytest

from heddle.errors import UsageError
from heddle.server.cli import config_from
from heddle.server.cli import run as server_run
from heddle.settings import SETTINGS, format_size, parse_size
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc

SIZES = [s for s in SETTINGS if s.kind == "size"]


@pytest.mark.parametrize(("text", "size"), [
    ("64MiB", 64 * 2**20), ("400MB", 400_000_000), ("16KiB", 16384), ("1048576", 2**20), ("1.5MiB", 1572864),
    ("0.5KB", 500), (" 2 gib ", 2 * 2**30), ("1TB", 10**12), ("7B", 7),
])
def test_sizes_with_a_unit_and_plain_bytes(text, size):
    assert parse_size(text) == size
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize("text", ["0.1KiB", "1.5B", "64M", "1e6", "-1", "MiB", "1,000", ""])
def test_anything_else_is_refused_naming_the_forms(text):
    with pytest.raises(ValueError, match="64MiB, 400MB, 16KiB"):
        parse_size(text)


def test_both_helps_take_sizes_and_show_the_default_in_units(capsys):
    assert {s.flag for s in SIZES} >= {"--max-response-bytes", "--max-tool-stdout-bytes", "--mount-max-bytes"}
    # By the commands' entry functions in this process: the same text as the processes print
    # (tests/engine/test_settings.py reads `heddle run --help` from one).
    cli = " ".join(heddle_inproc(capsys, "run", "--help")[1].split())
    assert server_run(["--help"], {}) == 0
    server = " ".join(capsys.readouterr().out.split())
    for shown in (cli, server):
        assert "--max-response-bytes SIZE" in shown and "--mount-max-bytes SIZE" in shown
        assert "(plain numbers are bytes). [default: 16MiB]" in shown
        assert "[default: 64MiB]" in shown


def test_the_server_reads_a_size_with_its_unit_and_refuses_one_that_is_not_whole(capsys):
    config = config_from(["--max-response-bytes", "400MB", "--mount-max-bytes", "16KiB",
                          "--max-tool-stdout-bytes", "4096"], {})
    assert (config.settings.max_response_bytes, config.settings.mount_max_bytes,
            config.settings.max_tool_stdout_bytes) == (400_000_000, 16384, 4096)
    assert capsys.readouterr().err == ""
    assert server_run(["--mount-max-bytes", "0.1KiB"], {}) == 2
    assert "--mount-max-bytes: '0.1KiB' is not a whole number of bytes" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--max-response-bytes 0B: must be at least 1"):
        config_from(["--max-response-bytes", "0B"], {})


def test_the_cli_applies_a_size_with_its_unit_as_the_same_plain_bytes(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "blob").write_bytes(b"x" * 2000)
    f = FlowDoc()
    s, e = f.start(["x"]), f.end(["x"])
    f.control(s, e)
    flow = f.write(tmp_path / "f.json")
    refusals = set()
    for limit in ("1KiB", "1024"):
        rc, _, err = heddle_inproc(capsys, "run", flow, "--input", '{"x": "a"}', "--mount", data,
                                   "--mount-max-bytes", limit)
        assert rc == 2, err
        refusals.add(err.splitlines()[-1])
    assert refusals == {(f"error: mount {data}:data:ro: more than 1024 bytes; mount a smaller folder or raise "
                         "--mount-max-bytes")}
    rc, _, err = heddle_inproc(capsys, "run", flow, "--input", '{"x": "a"}', "--mount", data,
                               "--mount-max-bytes", "2KB")
    assert rc == 0, err
    assert "note:" not in err
    rc, _, err = heddle_inproc(capsys, "run", flow, "--mount-max-bytes", "2 kilobytes")
    assert rc == 2 and err.splitlines()[-1].startswith("error: --mount-max-bytes: '2 kilobytes' is not a size"), err
