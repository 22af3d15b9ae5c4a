"""tests/support/cli_inproc.py's `heddle_inproc`, shaped as tests/support/cli.py's `heddle` answers.

So one test can check a real process for the step it is about and read the other commands of
the same state in-process, with the same `state_of` and `error_line` checks on either.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support.cli_inproc import heddle_inproc


def heddle_here(capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess[str]:
    """`heddle ARGS` run in this process, as a CompletedProcess (argv, exit status, stdout, stderr)."""
    rc, out, err = heddle_inproc(capsys, *args)
    return subprocess.CompletedProcess(["heddle", *[str(a) for a in args]], rc, out, err)
