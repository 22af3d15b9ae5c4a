"""Progress for long packs and opens: a bar on a terminal, silence in a pipe."""

from __future__ import annotations

import sys
from typing import IO, Any

from heddle.format.limits import MiB
from heddle.format.progress import Progress


class TerminalProgress:
    """A rich bar on `stream`, shown only when the work is at least `min_bytes`.

    Sizes and speeds are in binary units (KiB, MiB, GiB), as every heddle message writes them,
    and the bar counts exactly the bytes its caller said it would: a caller making two passes
    over the same bytes starts the bar once per pass.
    """

    def __init__(self, stream: IO[str], min_bytes: int) -> None:
        self._stream = stream
        self._min_bytes = min_bytes
        self._bar: Any = None
        self._task: Any = None

    def start(self, total: int, label: str) -> None:
        self.finish()
        if total < self._min_bytes:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            _binary_speed_column(),
            console=Console(file=self._stream),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total)

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _binary_speed_column() -> Any:
    # rich's own speed column writes decimal units (MB/s) beside a binary size (MiB).
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    from heddle.cli.output import binary_size

    class BinarySpeed(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("?" if speed is None else f"{binary_size(speed)}/s", style="progress.data.speed")

    return BinarySpeed()


def terminal_progress(stream: IO[str] | None = None, *, min_bytes: int = 16 * MiB) -> Progress | None:
    """A progress bar when `stream` (default stderr) is a terminal and the command is not --quiet
    and NO_COLOR is not set; else None."""
    from heddle.cli.output import Verbosity, decorated, verbosity

    stream = stream if stream is not None else sys.stderr
    if verbosity() is Verbosity.QUIET or not decorated(stream):
        return None
    return TerminalProgress(stream, min_bytes)
