"""`GET /v1/tools`: every tool the server's runs have, without paths, programs or argv templates."""

from __future__ import annotations

import json
from pathlib import Path

from heddle.server.openapi import openapi_document
from tests.plugins.test_tool_registry import LOOKUP_SCHEMA, _lookup_flow, finder, folder
from tests.support.server_thread import threaded_server


def test_the_tools_route_lists_what_the_server_serves_and_where_nothing_is(tmp_path: Path) -> None:
    tools, plugin = folder(tmp_path), finder(tmp_path)
    # What the server answers, not its process: served from a thread by the command's own entry.
    with threaded_server(tmp_path, "--tools-dir", tools, "--commands", tmp_path / "commands.yaml",
                         "--plugin", plugin, "--discover-tools") as server, server.client() as client:
        response = client.get("/v1/tools")
        assert response.status_code == 200, response.text
        listing = response.json()
        rows = {row["name"]: row for row in listing["tools"]}
        assert {name: row["source"] for name, row in rows.items()} == {
            "echo": "tools-dir", "lookup": "plugin", "shout": "plugin", "word_count": "command"}
        assert rows["lookup"]["discovered"] is True and rows["lookup"]["input_schema"] == LOOKUP_SCHEMA
        # Nothing of where the tools live or how a command runs.
        text = response.text
        assert all("path" not in row for row in rows.values())
        for hidden in (str(tmp_path), "echo.sh", "plugin.py", "executable", "argv", '"-w"', "GNU coreutils"):
            assert hidden not in text, hidden
        # The capabilities still name the tools, by name alone.
        named = client.get("/v1/capabilities").json()["tools"]
        assert "echo" in named and all(isinstance(name, str) for name in named)
        # A tool the plugin listed at start-up runs in the server's runs.
        flow = json.loads(_lookup_flow(tmp_path).read_text(encoding="utf-8"))
        run = client.post("/v1/runs", json={"flow": flow, "inputs": {"word": "weft"}})
        assert run.status_code == 200, run.text
        assert run.json()["state"]["meaning"] == "the meaning of weft"


def test_the_openapi_document_describes_the_route() -> None:
    doc = openapi_document("0")
    ok = doc["paths"]["/v1/tools"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/ToolList"}
    listed = doc["components"]["schemas"]["ListedTool"]
    assert listed["additionalProperties"] is False and "path" not in listed["properties"]
