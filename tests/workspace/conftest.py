"""Fixtures for workspace tests: a folder of real tools, a warning collector, a TCP server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workspace.tooling import ECHO, PROBE, ToolBox, Warnings, write_tool


@pytest.fixture
def toolbox(tmp_path: Path) -> ToolBox:
    tools_dir = tmp_path / "tools"
    return ToolBox(
        tools_dir=tools_dir,
        tools={
            "probe": write_tool(tools_dir, "probe", PROBE),
            "echo": write_tool(tools_dir, "echo", ECHO),
        },
    )


@pytest.fixture
def warned() -> Warnings:
    return Warnings()


@pytest.fixture
def tcp_server() -> Iterator[int]:
    """A real TCP server on 127.0.0.1 that answers every connection with b"pong"."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()
