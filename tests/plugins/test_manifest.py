"""Reading manifests: every refusal names the file and the field, and reading runs nothing."""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from heddle.plugin_host import PluginHost, load_manifest, manifest_schema
from heddle.plugin_host.errors import PluginLoadError
from tests.plugins.support import make_plugin, middleware, node_type
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import write_tool


def refusal(path) -> str:
    with pytest.raises(PluginLoadError) as caught:
        load_manifest(path)
    message = caught.value.message
    assert "\n" not in message
    return message


def rewrite(manifest, **changes):
    data = json.loads(manifest.read_text())
    data.update(changes)
    manifest.write_text(json.dumps(data))
    return manifest


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(manifest_schema())


def test_a_good_manifest_is_typed(tmp_path):
    write_tool(tmp_path / "p" / "bin", "lookup.py", "out = {}")
    (tmp_path / "p" / "data").mkdir(parents=True)
    (tmp_path / "p" / "data" / "rules.json").write_text("{}")
    manifest = make_plugin(
        tmp_path / "p", name="good",
        components=[node_type("Shout", ["text"], ["loud"], branches=["a", "b"]),
                    middleware("Gate", "toolCall", "nodeError"),
                    {"componentType": "Csv", "kind": "encoder", "protocol": "csv", "contentType": "text/csv"}],
        tools=[{"name": "lookup", "description": "d", "inputSchema": {"type": "object"}, "path": "bin/lookup.py"},
               {"name": "ask", "description": "d", "inputSchema": {"type": "object"}, "componentType": "Asker"}],
        files=["data/rules.json"])
    m = load_manifest(manifest)
    assert m.name == "good" and m.program == (tmp_path / "p" / "plugin.py").resolve()
    shout, gate, csv = m.components
    assert shout.branches == ("a", "b") and [p["title"] for p in shout.inputs] == ["text"]
    assert gate.seams == {("toolCall", "before"), ("toolCall", "after"), ("nodeError", "after")}
    assert csv.protocol == "csv" and csv.content_type == "text/csv"
    assert m.tools[0].path == (tmp_path / "p" / "bin" / "lookup.py").resolve() and m.tools[1].component_type == "Asker"
    assert m.files == ("data/rules.json",)
    assert load_manifest(tmp_path / "p").name == "good"  # the folder is enough


@pytest.mark.parametrize("change, expected", [
    ({"colour": "red"}, "unknown field 'colour'; the fields are: name, version"),
    ({"components": [{"componentType": "G", "kind": "middleware", "seams": ["node"], "branches": ["x"]}]},
     "components[0]: unknown field 'branches'; a middleware component has: componentType, kind"),
    ({"components": [{"componentType": "N", "kind": "node", "seams": ["node"]}]},
     "components[0]: unknown field 'seams'; a node component has"),
    ({"components": [{"componentType": "G", "kind": "middleware"}]}, "components[0].seams is missing"),
    ({"components": [{"componentType": "G", "kind": "middleware", "seams": ["toolcall"]}]},
     "components[0].seams[0]: 'toolcall' is not one of node, node.before"),
    ({"components": [{"componentType": "G", "kind": "gadget"}]},
     "components[0].kind: 'gadget' is not one of node, middleware, encoder, store"),
    ({"capabilities": ["runTool", "fly"]}, "capabilities[1]: 'fly' is not one of runTool, callModel, emitEvent, log"),
    ({"name": "has space"}, "name: 'has space' does not match"),
    ({"command": []}, "command: [] should be non-empty"),
    ({"tools": [{"name": "t", "description": "d", "inputSchema": {}}]},
     "tools[0]: give exactly one of 'path' (an executable in the plugin folder) or 'componentType'"),
    ({"tools": [{"name": "t", "description": "d", "inputSchema": {}, "path": "plugin.py", "componentType": "X"}]},
     "tools[0]: give exactly one of 'path'"),
])
def test_schema_refusals_name_the_field(tmp_path, change, expected):
    manifest = rewrite(make_plugin(tmp_path / "p"), **change)
    message = refusal(manifest)
    assert message.startswith(f"{manifest}: ") and expected in message


@pytest.mark.parametrize("change, expected", [
    ({"components": [middleware("Gate", "node"), middleware("Gate", "toolCall")]},
     "components[1] componentType 'Gate' is already used by components[0]"),
    ({"components": [middleware("Gate", "toolCall", "toolCall.before")]},
     "components[0].seams[1] 'toolCall.before' repeats toolCall.before"),
    ({"tools": [{"name": "t", "description": "", "inputSchema": {}, "componentType": "X"}] * 2},
     "tools[1] name 't' is already used by tools[0]"),
    ({"capabilities": ["log", "log"]}, "capabilities[1] capability 'log' is already used by capabilities[0]"),
    ({"components": [node_type("ToolNode")]}, "components[0].componentType 'ToolNode' is a built-in Agent Spec type"),
    ({"components": [{"componentType": "E", "kind": "encoder", "protocol": "heddle", "contentType": "text/plain"}]},
     "components[0].protocol 'heddle' is heddle's own event protocol"),
    ({"components": [middleware("G", "node", configSchema={"type": "objekt"})]},
     "components[0].configSchema is not a valid JSON Schema"),
    ({"tools": [{"name": "t", "description": "", "inputSchema": {"type": "string"}, "componentType": "X"}]},
     "tools[0].inputSchema must describe an object"),
])
def test_rule_refusals_name_the_field(tmp_path, change, expected):
    message = refusal(rewrite(make_plugin(tmp_path / "p"), **change))
    assert expected in message


@pytest.mark.parametrize("field, value, expected", [
    ("command", ["python3", "../outside.py"], "command[1] '../outside.py' leaves the plugin folder"),
    ("command", ["/usr/bin/python3"], "command[0] '/usr/bin/python3' is absolute"),
    ("command", ["python3", "missing.py"], "command[1] 'missing.py' does not exist"),
    ("command", ["python3", "-u"], "names no program"),
    ("files", ["../secret.txt"], "files[0] '../secret.txt' leaves the plugin folder"),
    ("files", ["nope.txt"], "files[0] 'nope.txt' does not exist"),
    ("tools", [{"name": "t", "description": "", "inputSchema": {}, "path": "/bin/sh"}], "tools[0].path '/bin/sh' is absolute"),
    ("tools", [{"name": "t", "description": "", "inputSchema": {}, "path": "../x/y.sh"}], "tools[0].path '../x/y.sh' leaves"),
])
def test_paths_must_stay_inside_the_folder(tmp_path, field, value, expected):
    (tmp_path / "outside.py").write_text("")
    message = refusal(rewrite(make_plugin(tmp_path / "p"), **{field: value}))
    assert expected in message


def test_a_link_out_of_the_folder_and_a_tool_that_cannot_run_are_refused(tmp_path):
    (tmp_path / "elsewhere.txt").write_text("secret")
    manifest = make_plugin(tmp_path / "p")
    os.symlink(tmp_path / "elsewhere.txt", tmp_path / "p" / "link.txt")
    assert "files[0] 'link.txt' leads out of the plugin folder (through a link)" in refusal(rewrite(manifest, files=["link.txt"]))
    (tmp_path / "p" / "tool.sh").write_text("#!/bin/sh\n")
    tools = [{"name": "t", "description": "", "inputSchema": {}, "path": "tool.sh"}]
    assert "tools[0].path 'tool.sh' is not executable; run chmod +x on it" in refusal(rewrite(manifest, files=[], tools=tools))


def test_bad_json_and_duplicate_keys(tmp_path):
    manifest = make_plugin(tmp_path / "p")
    manifest.write_text('{"name": "a", "name": "b"}')
    assert "duplicate key 'name'" in refusal(manifest)
    manifest.write_text('{"name": ')
    assert "is not valid JSON" in refusal(manifest)
    assert "no such file" in refusal(tmp_path / "nothing" / "plugin.json")


def test_plugins_loaded_together_cannot_collide(tmp_path):
    a = make_plugin(tmp_path / "a", components=[middleware("Gate", "node"),
                                                {"componentType": "E", "kind": "encoder", "protocol": "md",
                                                 "contentType": "text/markdown"}],
                    tools=[{"name": "t", "description": "", "inputSchema": {}, "componentType": "X"}])
    b = make_plugin(tmp_path / "b", components=[middleware("Gate", "node")])
    c = make_plugin(tmp_path / "c", components=[{"componentType": "F", "kind": "encoder", "protocol": "md",
                                                 "contentType": "text/plain"}])
    d = make_plugin(tmp_path / "d", tools=[{"name": "t", "description": "", "inputSchema": {}, "componentType": "Y"}])
    e = make_plugin(tmp_path / "e", tools=[{"name": "t", "description": "", "inputSchema": {}, "componentType": "Y",
                                            "shadows": True}])
    same = make_plugin(tmp_path / "same", name="a")
    for other, expected in ((b, "componentType 'Gate' is also declared by plugin 'a'"),
                            (c, "protocol 'md' is also the protocol of plugin 'a'"),
                            (d, "tools[0].name 't' is also a tool of plugin 'a'; set \"shadows\": true"),
                            (same, "plugin name 'a' is also the name of")):
        with pytest.raises(PluginLoadError) as caught:
            PluginHost.load([a, other])
        assert expected in caught.value.message
    assert PluginHost.load([a, e]).tools["t"].plugin == "e"


def test_a_plugin_tool_may_replace_a_tools_folder_tool_only_when_it_says_so(tmp_path):
    tool = {"name": "search", "description": "", "inputSchema": {}, "componentType": "S"}
    host = PluginHost.load([make_plugin(tmp_path / "p", tools=[tool])])
    with pytest.raises(PluginLoadError) as caught:
        host.known_tools({"search": tmp_path / "tools" / "search.py"})
    assert "tools[0].name 'search' is also the tool" in caught.value.message and "shadows" in caught.value.message
    host = PluginHost.load([make_plugin(tmp_path / "q", tools=[{**tool, "shadows": True}])])
    assert host.known_tools({"search": tmp_path / "tools" / "search.py"})["search"] == host.manifests["q"].path


def test_settings_are_checked_against_the_component_schema(tmp_path):
    schema = {"type": "object", "required": ["limit"], "properties": {"limit": {"type": "integer"},
                                                                       "mode": {"type": "string", "default": "on"}}}
    manifest = make_plugin(tmp_path / "p", components=[middleware("Gate", "node", configSchema=schema)])
    host = PluginHost.load([manifest], config_specs=['Gate={"limit": 3}'])
    assert host.configs["Gate"] == {"limit": 3, "mode": "on"}
    (tmp_path / "gate.json").write_text('{"limit": 4}')
    assert PluginHost.load([manifest], config_specs=[f"Gate=@{tmp_path / 'gate.json'}"]).configs["Gate"]["limit"] == 4
    for specs, expected in (([], "Gate: the settings do not match the schema of plugin 'p' (Gate): 'limit' is a "
                                 "required property; pass --plugin-config Gate="),
                            (['Gate={"limit": "x"}'], "at limit: 'x' is not of type 'integer'"),
                            (['Gate={"limit": 3'], "--plugin-config Gate: not valid JSON"),
                            (["Gate"], "give TYPE=JSON or TYPE=@FILE"),
                            (['Nope={}', 'Gate={"limit": 1}'], "no loaded plugin declares component type 'Nope'; the loaded types are: Gate"),
                            (['Gate={"limit": 1}', 'Gate={"limit": 2}'], "Gate: given twice")):
        with pytest.raises(PluginLoadError) as caught:
            PluginHost.load([manifest], config_specs=specs)
        assert expected in caught.value.message, caught.value.message


def test_the_cli_reports_a_load_error_as_one_line_and_exit_2(tmp_path, capsys):
    flow = tmp_path / "flow.json"
    flow.write_text("{}")
    manifest = rewrite(make_plugin(tmp_path / "p"), tools=[{"name": "t", "description": "", "inputSchema": {},
                                                           "path": "../escape.sh"}])
    # `heddle run` as a process; `validate` and the second refusal through the same entry in this process.
    for command, real in (("run", True), ("validate", False)):
        proc = heddle(command, flow, "--plugin", manifest) if real else heddle_here(capsys, command, flow, "--plugin",
                                                                                     manifest)
        assert proc.returncode == 2
        assert error_line(proc) == (f"error: {manifest}: tools[0].path '../escape.sh' leaves the plugin folder; "
                                    f"keep it inside {(tmp_path / 'p').resolve()}")
    proc = heddle_here(capsys, "run", flow, "--plugin-config", "Gate={}")
    assert proc.returncode == 2 and "load the plugin with --plugin MANIFEST" in error_line(proc)
