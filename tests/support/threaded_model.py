"""The scripted model as a real HTTP server on 127.0.0.1, served from a thread of the test process.

    with threaded_model([{"content": "hi"}]) as m:
        heddle("run", flow_pointing_at(m.url), ...)
        assert m.requests()[0]["body"]["stream"] is True

The same app `heddle model serve` serves (heddle.model.scripted), on a port the system picks,
without a process start of its own: for CLI tests whose subject is the `heddle` process, not the
model's. tests/support/scripted_model.py starts it as a user would, for tests about that.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from heddle.model.scripted import ScriptedModel, base_url, bind, load_script


@dataclass
class ThreadedModel:
    url: str  # base URL, ending in /v1
    app: ScriptedModel

    def requests(self) -> list[dict[str, Any]]:
        """Every request received so far: {"path", "headers", "body"}, as `heddle model serve` records them."""
        return list(self.app.requests)


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        # Signals belong to the test process (pytest's own handlers), not to a thread's server.
        pass


@contextmanager
def threaded_model(script: list[dict[str, Any]] | Path, *, loop: bool = False) -> Iterator[ThreadedModel]:
    """`script` is the answers, or a JSON or YAML file of them (as `heddle model serve --script` reads)."""
    logged: list[str] = []
    app = ScriptedModel(load_script(script) if isinstance(script, Path) else script, loop=loop, log=logged.append)
    sock = bind("127.0.0.1", 0)
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    server = _Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        # The socket listens already (connections queue until the loop accepts them); waiting for
        # `started` only makes a start-up failure show here rather than as a refused request.
        while not server.started and thread.is_alive():
            thread.join(0.01)
        if not server.started:
            raise RuntimeError(f"the scripted model did not start; its log: {logged}")
        yield ThreadedModel(base_url(sock), app)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
