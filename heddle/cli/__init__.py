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


_collector_paused = False


def resume_collector() -> None:
    """Turn the cyclic garbage collector back on, if `main` paused it.

    Starting a command makes some forty thousand objects that live as long as the process
    (modules, classes, the document's validators); meanwhile the collector runs some ninety times,
    20 to 30 ms of a `heddle run`, to find a few hundred objects of garbage. `main` pauses it, and a
    command turns it back on (heddle.cli.flags: as its body starts; `heddle run` as its flow starts,
    or before it pulls or opens a bundle), first moving every object made so far out of its reach
    (`gc.freeze`), as next to none of them is going away; the interpreter's last collection, as the
    process exits, passes them over too (that exit cost a 3-ToolNode run some 70 ms of CPU).
    """
    global _collector_paused
    if _collector_paused:
        import gc

        _collector_paused = False
        gc.freeze()
        gc.enable()


def main() -> None:
    global _collector_paused
    argv = sys.argv[1:]
    if argv == ["--version"]:
        # The fast path: what typer's own --version prints, without building the app.
        from heddle import __version__

        sys.stdout.write(f"heddle {__version__}\n")
        sys.exit(0)
    import gc

    if gc.isenabled():
        gc.disable()
        _collector_paused = True
    # httpx's package imports its own command-line client (click, rich and pygments, some 80 ms)
    # when those are installed, as rich is here; heddle never runs that client, and httpx does
    # without it when it cannot be imported. Only this process's own entry point decides so.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    from heddle.cli.errors import run_app
    from heddle.cli.root import app

    sys.exit(run_app(app))
