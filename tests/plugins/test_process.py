"""The plugin process: handshake, timeouts, crashes and restarts, protocol and capability rules.
Every plugin here is a real process speaking the real protocol."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from heddle.plugin_host import load_manifest
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.launch import plan_launch
from heddle.plugin_host.process import CallbackError, PluginCallError, PluginProcess
from heddle.workspace.sandbox import SandboxPolicy
from tests.plugins.support import make_plugin, node_type

SLOW = '''
import os, sys, time

@plugin.node("Work")
def work(call):
    how = call.input.get("how")
    if how == "sleep":
        time.sleep(float(call.input["seconds"]))
    elif how == "trickle":
        for i in range(8):
            call.partial({"text": str(i)})
            time.sleep(0.2)
    elif how == "crash":
        sys.stderr.write("about to fail\\nboom: the plugin fell over\\n")
        sys.stderr.flush()
        os._exit(3)
    elif how == "garbage":
        sys.__stdout__.write("this is not json\\n")
        sys.__stdout__.flush()
        time.sleep(5)
    elif how == "log":
        call.log("slow host")
    elif how == "fail":
        raise ValueError("the input was wrong")
    return {"pid": os.getpid()}
'''


def process(tmp_path, code: str = SLOW, *, timeout: float = 5.0, capabilities=("log",), program: str | None = None):
    manifest = load_manifest(make_plugin(tmp_path / "p", name="worker", components=[node_type("Work")], code=code,
                                         program=program, capabilities=()))
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return PluginProcess("worker", lambda: plan_launch(manifest, home=home, policy=SandboxPolicy()),
                         timeout=timeout, capabilities=frozenset(capabilities))


def execute(proc: PluginProcess, handler=None, on_partial=None, **input):
    return proc.call("execute", {"component": "Work", "input": input}, handler=handler, on_partial=on_partial)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_started_on_the_first_call_and_reused(tmp_path):
    async def main():
        proc = process(tmp_path)
        assert proc.pid is None  # nothing runs until a call
        first = await execute(proc)
        second = await execute(proc)
        assert first == second and proc.starts == 1
        assert first["output"]["pid"] == proc.pid
        await proc.close()
        assert not alive(first["output"]["pid"])

    asyncio.run(main())


def test_a_silent_call_is_cancelled_and_the_process_killed_then_restarted(tmp_path):
    async def main():
        proc = process(tmp_path, timeout=0.5)
        pid = (await execute(proc))["output"]["pid"]
        started = time.monotonic()
        with pytest.raises(PluginError) as caught:
            await execute(proc, how="sleep", seconds=30)
        assert time.monotonic() - started < 5
        assert caught.value.message == ("plugin 'worker': call 'execute' was silent for more than 0.5 s "
                                        "(--plugin-timeout); it was cancelled and the process killed")
        for _ in range(50):
            if not alive(pid):
                break
            await asyncio.sleep(0.05)
        assert not alive(pid)
        again = await execute(proc)
        assert again["output"]["pid"] != pid and proc.starts == 2
        await proc.close()

    asyncio.run(main())


def test_partials_and_heddle_working_for_the_plugin_are_not_silence(tmp_path):
    async def main():
        proc = process(tmp_path, timeout=1.0)
        seen = []
        result = await execute(proc, on_partial=seen.append, how="trickle")  # 1.6 s, a partial every 0.2 s
        assert [p["text"] for p in seen] == [str(i) for i in range(8)] and "pid" in result["output"]

        async def slow_host(method, params):
            await asyncio.sleep(2.0)  # longer than the timeout, but the plugin is waiting on heddle
            return {}

        assert "pid" in (await execute(proc, handler=slow_host, how="log"))["output"]
        await proc.close()

    asyncio.run(main())


def test_a_crash_fails_the_calls_in_flight_with_its_last_stderr_lines_and_the_next_call_restarts(tmp_path):
    async def main():
        proc = process(tmp_path)
        pid = (await execute(proc))["output"]["pid"]
        waiting = asyncio.create_task(execute(proc, how="sleep", seconds=3))
        await asyncio.sleep(0.3)
        with pytest.raises(PluginError) as caught:
            await execute(proc, how="crash")
        expected = ("exited with status 3 during {}; its last stderr lines: about to fail | "
                    "boom: the plugin fell over")
        assert caught.value.message == "plugin 'worker': " + expected.format("'execute'")
        with pytest.raises(PluginError) as other:
            await waiting
        assert "exited with status 3 during 'execute'" in other.value.message
        assert not alive(pid)
        assert (await execute(proc))["output"]["pid"] != pid and proc.starts == 2
        await proc.close()

    asyncio.run(main())


def test_a_plugin_error_answer_and_a_protocol_violation(tmp_path):
    async def main():
        proc = process(tmp_path)
        with pytest.raises(PluginCallError) as answered:
            await execute(proc, how="fail")
        assert str(answered.value) == "ValueError: the input was wrong"
        with pytest.raises(PluginError) as broken:
            await execute(proc, how="garbage")
        assert "wrote a line that is not JSON" in broken.value.message
        assert "stdout is for protocol messages only, print anything else on stderr" in broken.value.message
        assert "'this is not json'" in broken.value.message
        await proc.close()

    asyncio.run(main())


def test_capabilities_and_the_call_a_request_acts_for_are_enforced(tmp_path):
    code = '''
from heddle.plugin import HeddleCallError

@plugin.node("Work")
def work(call):
    out = {}
    for name, ask in (("log", lambda: call.log("hi")), ("emit", lambda: call.emit("x")),
                      ("stray", lambda: plugin.request("log", {"message": "m", "for": 9999})),
                      ("unknown", lambda: plugin.request("launchMissiles", {"for": call.id}))):
        try:
            ask()
            out[name] = "ok"
        except HeddleCallError as exc:
            out[name] = str(exc)
    return out
'''

    async def main():
        proc = process(tmp_path, code, capabilities=("log", "runTool"))
        logged = []

        async def host(method, params):
            logged.append((method, params.get("message")))
            return {}

        out = (await execute(proc, handler=host))["output"]
        assert out["log"] == "ok" and logged == [("log", "hi")]
        assert out["emit"] == ("emitEvent: this plugin was not granted the 'emitEvent' capability; "
                               "list it in the manifest's capabilities")
        assert out["stray"] == "log: params.for must name the heddle call this acts for, one still in flight (got 9999)"
        assert out["unknown"].startswith("unknown method 'launchMissiles'; a plugin may call runTool")
        await proc.close()

    asyncio.run(main())


def test_a_handler_refusal_reaches_the_plugin(tmp_path):
    code = '''
from heddle.plugin import HeddleCallError

@plugin.node("Work")
def work(call):
    try:
        call.log("x")
    except HeddleCallError as exc:
        return {"heard": str(exc)}
    return {}
'''

    async def main():
        proc = process(tmp_path, code)

        async def host(method, params):
            raise CallbackError("log: not now")

        assert (await execute(proc, handler=host))["output"] == {"heard": "log: not now"}
        await proc.close()

    asyncio.run(main())


def test_the_init_handshake_must_agree_on_the_protocol(tmp_path):
    program = '''import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    print(json.dumps({"id": msg["id"], "result": {"protocol": 2}}), flush=True)
'''

    async def main():
        proc = process(tmp_path, program=program)
        with pytest.raises(PluginError) as caught:
            await execute(proc)
        assert caught.value.message == ("plugin 'worker': answered init with protocol 2; heddle speaks protocol 1, "
                                        "answer {\"protocol\": 1}")

    asyncio.run(main())


def test_a_plugin_that_dies_at_start_says_why(tmp_path):
    program = 'import sys\nsys.stderr.write("ImportError: no module named magic\\n")\nsys.exit(1)\n'

    async def main():
        proc = process(tmp_path, program=program)
        with pytest.raises(PluginError) as caught:
            await execute(proc)
        assert caught.value.message == ("plugin 'worker': exited with status 1 during 'init'; its last stderr lines: "
                                        "ImportError: no module named magic")

    asyncio.run(main())


LOUD = '''
import os, sys

@plugin.node("Work")
def work(call):
    # A stderr line past the host's cap, then a crash whose message must still be read.
    sys.stderr.write("x" * (1 << 20) + "\\n")
    sys.stderr.flush()
    if call.input.get("how") == "crash":
        sys.stderr.write("boom: after the long line\\n")
        sys.stderr.flush()
        os._exit(3)
    return {"pid": os.getpid()}
'''


def test_a_stderr_line_past_the_cap_is_dropped_and_reading_goes_on(tmp_path):
    manifest = load_manifest(make_plugin(tmp_path / "p", name="worker", components=[node_type("Work")], code=LOUD,
                                         capabilities=()))
    home = tmp_path / "home"
    home.mkdir()

    async def main():
        proc = PluginProcess("worker", lambda: plan_launch(manifest, home=home, policy=SandboxPolicy()),
                             timeout=10.0, capabilities=frozenset(), max_line=64 * 1024)
        try:
            # Its stderr is still read: the plugin is not left blocked on a full pipe.
            assert (await execute(proc))["output"]["pid"] == proc.pid
            with pytest.raises(PluginError) as caught:
                await execute(proc, how="crash")
            assert "boom: after the long line" in caught.value.message
            assert "(a line longer than 65536 bytes)" in caught.value.message
        finally:
            await proc.close()

    asyncio.run(main())
