"""What the packer and the verifier report while they work; the terminal bar lives with the CLI."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, total: int, label: str) -> None: ...

    def advance(self, n: int) -> None: ...

    def finish(self) -> None: ...
