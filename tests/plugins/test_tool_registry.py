"""The tool registry: `heddle tools`, and the tools a plugin lists when asked (--discover-tools)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.canonical import fingerprint
from heddle.engine.options import RunOptions
from heddle.plugin import Plugin
from heddle.plugin_host import PluginHost
from heddle.plugin_host.errors import PluginError, PluginLoadError
from heddle.plugin_host.manifest import discovered_tools, load_manifest
from heddle.agentspec import load_flow
from heddle.tools.catalog import catalog
from heddle.tools.schema import input_fingerprint
from tests.plugins.support import make_plugin
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_script

SHOUT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
LOOKUP_SCHEMA = {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
# A plugin from the SDK: one tool its manifest declares, one it lists only when asked.
CODE = f"""
@plugin.tool("shout")
def shout(call):
    return {{"text": call.arguments["text"].upper()}}

@plugin.tool("lookup", description="What a word means", input_schema={LOOKUP_SCHEMA!r})
def lookup(call):
    return {{"meaning": "the meaning of " + call.arguments["word"]}}
"""
COMMANDS = """commands:
  - name: word_count
    description: Count the words of a file in the workspace
    input_schema:
      type: object
      properties: {path: {type: string}}
      required: [path]
    executable: wc
    version_probe: ["--version"]
    expected_version: "wc (GNU coreutils) 9.1"
    argv: ["-w", "{path}"]
    timeout_seconds: 5
    working_directory: workspace
    adapter_version: "1"
    output: text
"""


def finder(tmp_path: Path, **extra: Any) -> Path:
    tools = [{"name": "shout", "description": "Shout a text", "inputSchema": SHOUT_SCHEMA, "componentType": "Shout"}]
    return make_plugin(tmp_path / "finder", tools=tools, code=CODE, capabilities=(),
                       **({"discoverTools": True} | extra))


def folder(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    write_script(tools, "echo.sh", "#!/bin/sh\ncat\n")
    (tmp_path / "commands.yaml").write_text(COMMANDS, encoding="utf-8")
    return tools


def _rows(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in listing["tools"]}


def test_heddle_tools_lists_the_folder_the_commands_and_the_plugin_and_what_it_discovers(tmp_path: Path) -> None:
    tools, plugin = folder(tmp_path), finder(tmp_path)
    proc = heddle("tools", "-t", tools, "--commands", tmp_path / "commands.yaml", "--plugin", plugin,
                  "--discover-tools", "--json")
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    rows = _rows(listing)
    assert sorted(rows) == ["echo", "lookup", "shout", "word_count"] and listing["toolboxes"] == []
    assert rows["echo"] == {"name": "echo", "source": "tools-dir", "description": "", "input_schema": None,
                            "input_schema_fingerprint": None, "path": str((tools / "echo.sh").resolve())}
    assert rows["shout"] == {"name": "shout", "source": "plugin", "description": "Shout a text",
                             "input_schema": SHOUT_SCHEMA, "input_schema_fingerprint": fingerprint(SHOUT_SCHEMA),
                             "plugin": "finder", "discovered": False}
    assert rows["lookup"] == {"name": "lookup", "source": "plugin", "description": "What a word means",
                              "input_schema": LOOKUP_SCHEMA, "input_schema_fingerprint": fingerprint(LOOKUP_SCHEMA),
                              "plugin": "finder", "discovered": True}
    command = rows["word_count"]
    assert command["source"] == "command" and command["input_schema_fingerprint"] == \
        fingerprint(command["input_schema"])
    assert set(command) == {"name", "source", "description", "input_schema", "input_schema_fingerprint"}
    # The fingerprint is the one bundles and heddle validate use: sha256: and 64 lowercase hex digits.
    assert all(len(r["input_schema_fingerprint"]) == 71 for r in rows.values() if r["input_schema"] is not None)


def test_without_the_flag_a_plugin_has_only_its_manifests_tools(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    tools, plugin = folder(tmp_path), finder(tmp_path)
    rc, out, err = heddle_inproc(capsys, "tools", "-t", tools, "--plugin", plugin, "--json")
    assert rc == 0, err
    assert sorted(_rows(json.loads(out))) == ["echo", "shout"]
    rc, out, err = heddle_inproc(capsys, "tools", "-t", tools, "--plugin", plugin)
    assert rc == 0 and out.splitlines()[0].split() == ["echo", "tools-dir", "-"], out
    rc, _, err = heddle_inproc(capsys, "tools", "-t", tools, "--discover-tools")
    assert rc == 2 and err.splitlines()[-1] == (
        "error: --discover-tools asks the loaded plugins which tools they serve, and none is loaded; load one with "
        "--plugin MANIFEST"), err


def _lookup_flow(tmp_path: Path) -> Path:
    f = FlowDoc("lookups")
    start = f.start(["word"])
    node = f.tool_node("look", server_tool("lookup", ["word"], ["meaning"]))
    end = f.end(["meaning"])
    f.control(start, node)
    f.control(node, end)
    return f.write(tmp_path / "flow.json")


def test_a_discovered_tool_runs_only_with_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow, plugin = _lookup_flow(tmp_path), finder(tmp_path)
    # The command's entry in this process (`heddle run --plugin` from a process: tests/plugins/test_cli.py).
    proc = heddle_here(capsys, "run", flow, "--plugin", plugin, "--discover-tools", "--input", '{"word": "loom"}')
    assert state_of(proc)["meaning"] == "the meaning of loom"
    rc, _, err = heddle_inproc(capsys, "run", flow, "--plugin", plugin, "--input", '{"word": "loom"}')
    assert rc == 2 and "ServerTool 'lookup' has no executable" in err, err
    # heddle validate agrees with heddle run, either way.
    rc, out, err = heddle_inproc(capsys, "validate", flow, "--plugin", plugin, "--json")
    assert rc == 2 and not json.loads(out)["valid"], err
    rc, out, err = heddle_inproc(capsys, "validate", flow, "--plugin", plugin, "--discover-tools", "--json")
    assert rc == 0 and json.loads(out)["valid"], out + err


def test_the_flow_gives_its_tools_and_the_folder_s_programs_their_schemas(tmp_path: Path) -> None:
    tools = folder(tmp_path)
    declared = server_tool("echo", ["message"], ["message"])
    remote = {"component_type": "RemoteTool", "id": "r1", "name": "weather", "description": "The weather",
              "url": "https://example.invalid/{{city}}", "http_method": "GET"}
    box = {"component_type": "MCPToolBox", "id": "b1", "name": "files",
           "client_transport": {"component_type": "StdioTransport", "id": "t1", "name": "t", "command": "srv"}}
    f = FlowDoc("listed")
    start = f.start(["query"])
    agent = f.agent("helper", "http://127.0.0.1:9/v1", tools=[declared, remote])
    f.components[agent]["agent"]["toolboxes"] = [box]
    end = f.end(["result"])
    f.control(start, agent)
    f.control(agent, end)
    flow = load_flow(f.write(tmp_path / "flow.json"))
    listed = catalog(tools={"echo": tools / "echo.sh"}, flow=flow)
    rows = _rows(listed.as_json(public=True))
    # The folder's program takes the schema the flow declares for it: the fingerprint a bundle seals.
    assert rows["echo"]["input_schema_fingerprint"] == input_fingerprint(_server_tool(declared))
    assert rows["echo"]["description"] == "the echo tool" and "path" not in rows["echo"]
    assert rows["weather"]["source"] == "remote"
    assert rows["weather"]["input_schema"]["properties"]["city"]["type"] == "string"
    assert listed.toolboxes == ("files",)


def _server_tool(document: dict[str, Any]) -> Any:
    from heddle.agentspec.components import ServerTool

    return ServerTool.model_validate(document)


def test_a_listing_is_checked_like_a_manifest(tmp_path: Path) -> None:
    manifest = load_manifest(finder(tmp_path))
    ok = {"name": "lookup", "description": "d", "inputSchema": LOOKUP_SCHEMA}
    assert [t.name for t in discovered_tools(manifest, {"tools": [ok]})] == ["lookup"]
    bad = [
        ([], 'answered listTools with something other than {"tools": [...]}'),
        ({"tools": [{**ok, "path": "x"}]}, "listTools tools[0] has ['description', 'inputSchema', 'name', 'path']"),
        ({"tools": [{**ok, "name": "a b"}]}, "listTools tools[0].name 'a b' does not match"),
        ({"tools": [{**ok, "name": "shout"}]}, "listTools tools[0].name 'shout' is also a tool its manifest lists"),
        ({"tools": [ok, ok]}, "listTools tools[1].name 'lookup' is also another tool it listed"),
        ({"tools": [{**ok, "inputSchema": {"type": "string"}}]}, "listTools tools[0].inputSchema must be"),
        ({"tools": [{**ok, "inputSchema": {"properties": 3}}]}, "listTools tools[0].inputSchema is not a valid JSON"),
    ]
    for answer, message in bad:
        with pytest.raises(ValueError) as caught:
            discovered_tools(manifest, answer)
        assert str(caught.value).startswith(message), (answer, caught.value)


def test_a_listed_tool_never_takes_the_tool_folders_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = folder(tmp_path)
    write_script(tools, "lookup.sh", "#!/bin/sh\ncat\n")
    rc, _, err = heddle_inproc(capsys, "tools", "-t", tools, "--plugin", finder(tmp_path), "--discover-tools")
    assert rc == 2 and err.splitlines()[-1] == (
        f"error: plugin 'finder' listed tool 'lookup' (listTools), which is also the tool {tools.resolve()}/lookup.sh; "
        "a listed tool never replaces another, so rename one"), err


def test_a_listed_tool_never_takes_another_plugins_name(tmp_path: Path) -> None:
    first = finder(tmp_path)
    second = make_plugin(tmp_path / "other", capabilities=(), code="",
                         tools=[{"name": "lookup", "description": "d", "inputSchema": {}, "componentType": "L"}])
    host = PluginHost([load_manifest(first), load_manifest(second)])

    async def ask() -> None:
        try:
            await host.discover_tools(RunOptions())
        finally:
            await host.aclose()

    with pytest.raises(PluginError, match="plugin 'finder': listed tool 'lookup', which is also a tool of plugin "
                                          "'other'; a listed tool never replaces another, so rename one"):
        asyncio.run(ask())


def test_the_manifest_field_is_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match=r"discoverTools: 'yes' is not of type 'boolean'"):
        load_manifest(finder(tmp_path, discoverTools="yes"))
    assert not load_manifest(finder(tmp_path, discoverTools=False)).discover_tools


def test_the_sdk_answers_list_tools() -> None:
    plugin = Plugin()

    @plugin.tool("lookup", description="d", input_schema=LOOKUP_SCHEMA)
    def lookup(call: Any) -> dict[str, Any]:
        return {}

    # One request handled as serve() hands it to a worker (a real process answers in the tests above).
    out = io.BytesIO()
    plugin._out = out
    plugin._handle({"id": 2, "method": "listTools", "params": {}})
    assert json.loads(out.getvalue()) == {"id": 2, "result": {"tools": [{"name": "lookup", "description": "d",
                                                                        "inputSchema": LOOKUP_SCHEMA}]}}

    @plugin.list_tools
    def listing(call: Any) -> list[dict[str, Any]]:
        return [{"name": "made", "description": "", "inputSchema": {}}]

    out.seek(0)
    out.truncate()
    plugin._handle({"id": 3, "method": "listTools", "params": {}})
    assert json.loads(out.getvalue())["result"] == {"tools": [{"name": "made", "description": "", "inputSchema": {}}]}
    with pytest.raises(ValueError, match="needs its input_schema too"):
        plugin.tool("half", description="no schema")


def test_heddle_tools_lists_a_bundles_own_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import heddle

    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    tools, plugin = folder(tmp_path), finder(tmp_path)
    f = FlowDoc("sealed")
    start = f.start(["message"])
    node = f.tool_node("say", server_tool("echo", ["message"], ["message"]))
    end = f.end(["message"])
    f.control(start, node)
    f.control(node, end)
    bundle = tmp_path / "app.heddle"
    sealed = heddle.seal(f.write(tmp_path / "flow.json"), output=bundle, tools_dir=tools, plugins=[plugin],
                         commands=tmp_path / "commands.yaml")
    rc, out, err = heddle_inproc(capsys, "tools", bundle, "--allow-unsigned", "--json")
    assert rc == 0, err
    rows = _rows(json.loads(out))
    assert {name: row["source"] for name, row in rows.items()} == {
        "echo": "tools-dir", "shout": "plugin", "word_count": "command"}
    # The sealed flow's ServerTool gives the bundle's program the schema its manifest fingerprints.
    assert rows["echo"]["input_schema_fingerprint"] == sealed.manifest.tools["echo"].fingerprint
    assert "path" in rows["echo"]  # on this machine the listing says where (the verified cache)
    rc, _, err = heddle_inproc(capsys, "tools", bundle, "--allow-unsigned", "-t", tools)
    assert rc == 2 and "--tools-dir cannot be used with the bundle" in err, err
