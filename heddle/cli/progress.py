"""Progress for long packs and opens: a bar on a terminal, silence in a pipe."""

from __future__ import annotations

import sys
from typing import IO, Any

from heddle.format.limits import MiB
from heddle.format.progress import Progress


class TerminalProgress:
    """A rich bar on `stream`, shown only when the work is at least `min_bytes`."""

    def __init__(self, stream: IO[str], min_bytes: int) -> None:
        self._stream = stream
        self._min_bytes = min_bytes
        self._bar: Any = None
        self._task: Any = None

    def start(self, total: int, label: str) -> None:
        if total < self._min_bytes:
            return
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
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


def terminal_progress(stream: IO[str] | None = None, *, min_bytes: int = 16 * MiB) -> Progress | None:
    """A progress bar when `stream` (default stderr) is a terminal, else None."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        return None
    return TerminalProgress(stream, min_bytes)
