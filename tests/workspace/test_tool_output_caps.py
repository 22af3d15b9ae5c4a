"""A tool process's output is bounded: stdout past its cap kills the call with one line naming the
cap; stderr is kept to its end, however much the tool prints."""

from __future__ import annotations

import asyncio
import resource

import pytest

from heddle.errors import ToolError
from heddle.tools import process
from heddle.tools.process import run_process

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(params=["reaped", "grouped"])
def starter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "grouped":
        monkeypatch.setattr(process.spawner, "available", lambda: False)
    elif not process.spawner.available():
        pytest.skip("the reaper server runs on Linux only")
    return str(request.param)


def test_endless_stdout_ends_the_call_at_the_cap(starter: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ToolError) as caught:
        asyncio.run(run_process("flood", ["sh", "-c", "yes"], b"", env=ENV, timeout=60, max_stdout=1 << 20,
                                stdout_hint="raise --max-tool-stdout-bytes if it needs more"))
    assert caught.value.message == ("tool 'flood': printed more than 1 MiB on stdout and was killed (raise "
                                    "--max-tool-stdout-bytes if it needs more)")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024


def test_output_printed_just_before_exit_is_held_to_the_cap_too(starter: str) -> None:
    with pytest.raises(ToolError, match="printed more than 1000 bytes on stdout"):
        asyncio.run(run_process("burst", ["sh", "-c", "printf '{}'; head -c 5000 /dev/zero"], b"", env=ENV,
                                max_stdout=1000))


def test_stderr_is_kept_to_its_end(starter: str) -> None:
    done = asyncio.run(run_process("loud", ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x >&2; echo end >&2"],
                                   b"", env=ENV))
    assert done.returncode == 0 and len(done.stderr) <= 2 * process.STDERR_KEEP
    assert done.stderr.endswith(b"xend\n")
