"""The `heddle` command: a thin typer shell over the library.

The app lives in heddle.cli.root and registers its commands lazily; this module imports
nothing but the standard library, so `heddle --version` never imports typer.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's constant, without importing typing before a command needs it
if TYPE_CHECKING:
    from typing import Any

    from heddle.cli.root import app as app


def __getattr__(name: str) -> Any:
    if name == "app":
        from heddle.cli.root import app

        return app
    raise AttributeError(f"module 'heddle.cli' has no attribute {name!r}")


def main() -> None:
    argv = sys.argv[1:]
    if argv == ["--version"]:
        # The fast path: what typer's own --version prints, without building the app.
        from heddle import __version__

        sys.stdout.write(f"heddle {__version__}\n")
        sys.exit(0)
    from heddle.cli.collector import pause_collector

    pause_collector()  # heddle.cli.collector says why
    # httpx's package imports its own command-line client (click, rich and pygments, some 80 ms)
    # when those are installed, as rich is here; heddle never runs that client, and httpx does
    # without it when it cannot be imported. Only this process's own entry point decides so.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from heddle.cli.errors import run_app
    from heddle.cli.root import app
    from heddle.shell_options import without_pydantic_plugins

    without_pydantic_plugins()  # heddle.shell_options says why
    sys.exit(run_app(app))
