"""Run the real `heddle` command as a user would, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def env_with(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Tools written as `#!/usr/bin/env python3` should find this interpreter first: it is the
    # one the suite runs on, and a version-manager shim would add a bash start-up per call.
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("OPENAI_API_KEY", None)
    env.update(extra or {})
    return env


def heddle(*args: Any, env: dict[str, str] | None = None, input: str | None = None, cwd: Path | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "heddle"), *[str(a) for a in args]]
    return subprocess.run(argv, capture_output=True, text=True, env=env_with(env), input=input, cwd=cwd,
                          timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)


def state_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"stdout should be one JSON object, got: {proc.stdout!r}"
    return json.loads(lines[0])


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert lines, f"no error line on stderr: {proc.stderr!r}"
    return lines[-1]
