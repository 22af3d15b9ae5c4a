"""Limits are reported in the units of the surface that set them: heddle-server's flags take
milliseconds, so its messages say `--timeout 300 ms`, where `heddle run` says `--timeout 0.3 s`."""

from __future__ import annotations

from tests.plugins.support import make_plugin, middleware
from tests.server.flows import ECHO, one_tool_flow, write_tools
from tests.support.cli import error_line
from tests.support.cli_inproc_proc import heddle_here
from tests.support.server_thread import threaded_server

NAP = "#!/bin/sh\nexec sleep 60\n"
HANG_ON_ONE_TOOL = '''
import time
@plugin.before("Hang", "toolCall")
def h(call):
    if call.params["tool"] == "hangs":
        time.sleep(60)
'''


def flows_and_tools(root):
    tools = write_tools(root / "tools", {"nap": NAP, "hangs": ECHO})
    flows = root / "flows"
    flows.mkdir(exist_ok=True)
    one_tool_flow("nap", "nap").write(flows / "nap.json")
    one_tool_flow("hang", "hangs").write(flows / "hang.json")
    return flows, tools


def failure(client, flow_path: str) -> dict:
    response = client.post("/v1/runs", json={"flowPath": flow_path, "inputs": {"x": 1}})
    assert response.status_code == 500, response.text
    return response.json()["error"]


def test_the_servers_timeouts_are_named_in_milliseconds(tmp_path, capsys):
    flows, tools = flows_and_tools(tmp_path)
    plugin = make_plugin(tmp_path / "p", components=[middleware("Hang", "toolCall.before")], code=HANG_ON_ONE_TOOL)
    # The server from a thread and `heddle run` in this process, by their own entry functions:
    # the messages are the subject (a failed run's 500 from a `heddle-server` process is
    # tests/server/test_routes.py's; the CLI's seconds from a process, tests/engine/test_settings.py's).
    with threaded_server(tmp_path, "--flows-root", flows, "--tools-dir", tools, "--tool-timeout", "300",
                         "--plugin", plugin, "--plugin-timeout", "500") as server, server.client() as client:
        assert failure(client, "nap.json")["message"] == (
            "tool 'nap': timed out after 300 ms and was killed (raise --tool-timeout if it needs longer)")
        assert failure(client, "hang.json")["message"] == (
            "plugin 'p': call 'before' was silent for more than 500 ms (--plugin-timeout); "
            "it was cancelled and the process killed")
    # The same tool under the CLI, whose durations are seconds.
    proc = heddle_here(capsys, "run", flows / "nap.json", "-t", tools, "--input", '{"x": 1}', "--tool-timeout",
                       "0.3")
    assert proc.returncode == 1
    assert error_line(proc) == ("error: tool 'nap': timed out after 0.3 s and was killed "
                                "(raise --tool-timeout if it needs longer)")
