"""The cyclic garbage collector, paused while a command starts (standard library only)."""

from __future__ import annotations

import gc

_paused = False


def pause_collector() -> None:
    """Pause the collector for `main`, while the command's modules, classes and validators are made."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


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
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
