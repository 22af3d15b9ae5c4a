"""JSON and YAML heddle did not write are read within caps: nesting depth, size, YAML aliases, and
the depth and size of a flow once its `$component_ref`s are resolved. Refused with one line,
never a RecursionError or a walk of an exponential tree."""

from __future__ import annotations

import json
import os

import pytest

from heddle.errors import DocumentError
from heddle.safeparse import (
    DEFAULT_PARSE_LIMITS,
    NotRegularFileError,
    ParseLimitError,
    check_json_depth,
    load_yaml,
    loads_json,
    loads_strict_json,
    read_regular,
)
from heddle.agentspec import load_flow_text, parse_flow
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc_proc import heddle_here

LIMIT = DEFAULT_PARSE_LIMITS.max_depth


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nesting_is_capped_before_the_parser_recurses():
    assert loads_json(nested(LIMIT)) is not None
    for text, column in ((nested(LIMIT + 1), LIMIT + 1), (nested(100_000), LIMIT + 1),
                         ('{"a":' * 5000 + "1" + "}" * 5000, 5 * LIMIT + 1)):
        with pytest.raises(ParseLimitError, match=f"nests deeper than {LIMIT} levels.*line 1, column {column}"):
            loads_json(text)
        with pytest.raises(ParseLimitError):
            loads_strict_json(text.encode())
    # Brackets inside strings are text, not nesting, escaped quotes included.
    assert loads_json(json.dumps({"s": "[" * 500 + '\\"{' * 500})) == {"s": "[" * 500 + '\\"{' * 500}
    # Where json would stop at an error first, the text is left for json to refuse.
    for text in ('"unterminated' + "[" * 500, "]" + "[" * 500):
        check_json_depth(text)
        with pytest.raises(json.JSONDecodeError):
            loads_json(text)
    with pytest.raises(ParseLimitError, match="line 2, column 65"):
        check_json_depth('["x",\n [' + nested(LIMIT) + "]]")


def test_yaml_nesting_aliases_and_cycles_are_capped():
    assert load_yaml("a: &x {k: [1]}\nb: *x\nc: {<<: *x, d: 2}") == {"a": {"k": [1]}, "b": {"k": [1]},
                                                                     "c": {"k": [1], "d": 2}}
    with pytest.raises(ParseLimitError, match=f"nests deeper than {LIMIT} levels"):
        load_yaml("x: " + nested(10_000))
    with pytest.raises(ParseLimitError, match=f"nests deeper than {LIMIT} levels"):
        load_yaml("\n".join(" " * i + "a:" for i in range(LIMIT + 2)))
    # Billion laughs: ten lines that stand for 10**9 strings.
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(ParseLimitError, match="once its aliases are expanded"):
        load_yaml("\n".join(bomb))
    with pytest.raises(ParseLimitError, match="refers to a node that holds it"):
        load_yaml("a: &a [*a]")
    half = nested(LIMIT // 2 + 2)
    with pytest.raises(ParseLimitError, match="nests deeper .* once its aliases are expanded"):
        load_yaml(f"a: &a {half}\nb: " + "[" * (LIMIT // 2) + "*a" + "]" * (LIMIT // 2))
    with pytest.raises(ParseLimitError, match="aliases .* are not accepted"):
        load_yaml("a: &a 1\nb: *a", aliases=False)


def test_a_flow_whose_references_nest_or_multiply_is_refused():
    def doc(refs: dict, at: str = "description") -> dict:
        return {"component_type": "Flow", "id": "f", "name": "f", at: {"$component_ref": "c0"},
                "$referenced_components": refs}

    chain = {f"c{i}": {"x": {"$component_ref": f"c{i + 1}"}} for i in range(2000)} | {"c2000": {"x": 1}}
    with pytest.raises(DocumentError, match="nests deeper than .* once its \\$component_refs are resolved"):
        parse_flow(doc(chain))
    # Resolved shallow first, then used deep: the depth of the later use is what counts.
    ordered = doc(chain, at="metadata")
    ordered["metadata"] = {f"k{i}": {"$component_ref": f"c{i}"} for i in range(2000, -1, -1)}
    with pytest.raises(DocumentError, match="nests deeper"):
        parse_flow(ordered)
    doubling = {f"c{i}": {"x": [{"$component_ref": f"c{i + 1}"}] * 2} for i in range(60)} | {"c60": {"x": 1}}
    with pytest.raises(DocumentError, match="stands for more than"):
        parse_flow(doc(doubling))
    with pytest.raises(DocumentError, match=f"flow.json: nests deeper than {LIMIT}"):
        load_flow_text(nested(50_000), source="flow.json")


def test_read_regular_refuses_what_is_not_a_file_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory"), (os.devnull, "a character device")):
        with pytest.raises(NotRegularFileError) as caught:
            read_regular(path)
        assert caught.value.kind == kind
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 1025)
    with pytest.raises(ParseLimitError, match="over 1024 bytes"):
        read_regular(big, max_bytes=1024)
    assert read_regular(big, max_bytes=1025) == b" " * 1025


def test_a_deep_flow_file_or_an_alias_bomb_is_an_invalid_flow(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text('{"component_type": "Flow", "metadata": ' + nested(100_000) + "}")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("component_type: Flow\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n"
                    + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n" for i in range(1, 9)))
    # The deep file in a process (its stack is the command's own, not a test runner's); the alias
    # bomb through the same entry function in this process.
    for path, needle, real in ((deep, f"{deep}: nests deeper than {LIMIT} levels", True),
                               (bomb, f"{bomb}: stands for more than", False)):
        proc = heddle("validate", path, timeout=30) if real else heddle_here(capsys, "validate", path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert needle in error_line(proc) and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_a_tool_printing_json_nested_too_deep_fails_its_call_in_one_line(tmp_path):
    from tests.server.flows import tool_chain, write_tools

    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    tools = write_tools(tmp_path / "tools", {"deep": f"#!/bin/sh\ncat >/dev/null\nprintf '%s' '{deep}'\n"})
    flow = tool_chain("deep", ["deep"]).write(tmp_path / "deep.json")
    proc = heddle("run", flow, "--tools-dir", tools, "--input", '{"x": "hi"}')
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
    assert f"nests deeper than {LIMIT} levels" in error_line(proc) and "tool 'deep'" in error_line(proc)


def test_model_and_plugin_messages_are_read_within_the_cap():
    from heddle.plugin_host.protocol import ProtocolViolation, decode

    with pytest.raises(ProtocolViolation, match="not JSON"):
        decode(nested(10_000).encode())
