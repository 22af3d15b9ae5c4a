"""`heddle ARGS` through the CLI's own entry function, in the test's process.

For setup and for reading what a command reports where the process start is not what the test
is about: the same commands, flags, exit statuses and printed lines as tests/support/cli.py's
`heddle`, without the ~0.6 s of CPU each start costs. Environment variables come from this
process (monkeypatch them), as a subprocess would inherit them.
"""

from __future__ import annotations

import pytest


def heddle_inproc(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `heddle ARGS`, run by `run_app` as the entry point runs it."""
    from heddle.cli import app
    from heddle.cli.errors import run_app

    capsys.readouterr()  # what the test printed before is not this command's output
    rc = run_app(app, [str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err
