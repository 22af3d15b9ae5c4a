"""Reading flow documents: formats, references, component types, versions."""

from __future__ import annotations

import json

import pytest

from heddle.errors import DocumentError
from heddle.agentspec import load_flow, load_flow_text
from heddle.agentspec.references import resolve_references
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc
from tests.support.inproc import check_doc, run_doc


def passthrough(tmp_path, suffix=".json", **kw):
    f = FlowDoc("pass", **kw)
    s = f.start(["text"])
    e = f.end(["text"])
    f.control(s, e)
    return f.write(tmp_path / f"flow{suffix}")


def test_json_and_yaml_run_the_same(tmp_path):
    # The reading by suffix is the document loader's, in-process; `--flow`/`--format` below are the CLI's.
    for suffix in (".json", ".yaml", ".yml"):
        path = passthrough(tmp_path, suffix)
        assert run_doc(path, None, {"text": "héllo"}) == {"text": "héllo"}


def test_format_flag_forces_yaml(tmp_path, capsys):
    yaml_path = passthrough(tmp_path, ".yaml")
    odd = tmp_path / "flow.agent"
    odd.write_text(yaml_path.read_text())
    # A name that does not say flow is read as one only with --flow; then it is JSON unless --format says.
    # The command's flags through its entry function in this process (its process: the test below).
    proc = heddle_here(capsys, "run", "--flow", odd, "--input", '{"text": "x"}')
    assert proc.returncode == 2 and "is not valid JSON" in error_line(proc)
    assert state_of(heddle_here(capsys, "run", "--flow", odd, "--format", "yaml", "--input", '{"text": "x"}')) == {
        "text": "x"}


def test_inline_components_without_references(tmp_path):
    path = passthrough(tmp_path, use_refs=False)
    assert "$component_ref" not in path.read_text()
    assert run_doc(path, None, {"text": "x"}) == {"text": "x"}


def test_nested_references_resolve_at_any_depth_and_share_one_object():
    doc = {
        "a": {"$component_ref": "outer"},
        "$referenced_components": {
            "outer": {"inner": {"$component_ref": "leaf"}, "again": {"$component_ref": "leaf"},
                      "$referenced_components": {"deep": {"x": 1}}, "deeper": {"$component_ref": "deep"}},
            "leaf": {"value": 42},
        },
    }
    out = resolve_references(doc)
    assert out["a"]["inner"] == {"value": 42}
    assert out["a"]["inner"] is out["a"]["again"]
    assert out["a"]["deeper"] == {"x": 1}
    assert "$referenced_components" not in out


def test_missing_reference_names_the_id_and_where_it_was_used():
    doc = {"component_type": "Flow", "start_node": {"$component_ref": "ghost-id"}, "$referenced_components": {}}
    with pytest.raises(DocumentError) as err:
        load_flow_text(json.dumps(doc), source="f.json")
    assert "ghost-id" in str(err.value) and "$.start_node" in str(err.value)


def test_reference_cycles_are_refused():
    doc = {"x": {"$component_ref": "a"},
           "$referenced_components": {"a": {"next": {"$component_ref": "b"}}, "b": {"next": {"$component_ref": "a"}}}}
    with pytest.raises(DocumentError, match="reference cycle a -> b -> a"):
        resolve_references(doc)


def test_unknown_component_type_lists_the_known_ones(tmp_path):
    path = passthrough(tmp_path)
    doc = json.loads(path.read_text())
    first = doc["nodes"][0]["$component_ref"]
    doc["$referenced_components"][first]["component_type"] = "TeleportNode"
    path.write_text(json.dumps(doc))
    code, line = check_doc(path)
    assert code == 2
    assert "TeleportNode" in line and "StartNode" in line and "OllamaConfig" in line


@pytest.mark.parametrize("version,ok", [("25.4.1", True), ("26.1.2", True), ("26.0", True), ("24.3.0", False),
                                        ("27.0.0", False)])
def test_agentspec_versions(tmp_path, version, ok):
    path = passthrough(tmp_path, version=version)
    if ok:
        load_flow(path)
    else:
        with pytest.raises(DocumentError, match=f"agentspec_version '{version}' is not supported"):
            load_flow(path)


def test_missing_file_and_bad_json_are_one_line_errors(tmp_path, capsys):
    proc = heddle_here(capsys, "run", tmp_path / "nope.json")  # the refusal from a process: `validate` below
    assert proc.returncode == 2 and "nope.json: no such file" in error_line(proc)
    bad = tmp_path / "bad.json"
    bad.write_text('{"component_type": "Flow",')
    proc = heddle("validate", bad)
    assert proc.returncode == 2 and "bad.json" in error_line(proc) and "line 1" in error_line(proc)
    assert "Traceback" not in proc.stderr


def test_field_errors_name_the_path(tmp_path):
    path = passthrough(tmp_path)
    doc = json.loads(path.read_text())
    start = doc["start_node"]["$component_ref"]
    doc["$referenced_components"][start]["inputs"] = [{"type": "string"}]
    path.write_text(json.dumps(doc))
    code, line = check_doc(path)
    assert code == 2
    assert "title" in line and "start_node.inputs" in line
