"""Rendering a run's events through an encoder plugin (`--protocol NAME`).

Events are sent one `encode` at a time, in the order they happened, and whatever the plugin
answers (`{"data": "..."}`, or partials of that shape) is written out as it comes. When the run
ends, `finishEncode` gets the final state or the error (or, for a run in a session that stopped to
wait for a person, what it waits for), and its data closes the output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from heddle.errors import RunError, UsageError
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.process import PluginCallError

if TYPE_CHECKING:
    from heddle.blocking import Tasks
    from heddle.engine.events import Event
    from heddle.engine.options import RunOptions
    from heddle.plugin_host.host import PluginHost
    from heddle.plugin_host.manifest import Component

Write = Callable[[str], None]


def encoder_for(host: PluginHost | None, protocol: str) -> Component:
    """The encoder component for `protocol`, or the usage error listing the protocols there are."""
    comp = host.encoders.get(protocol) if host is not None else None
    if comp is None:
        known = ", ".join(["heddle", *sorted(host.encoders if host else ())])
        hint = "" if host and host.encoders else "; an encoder plugin adds one (--plugin MANIFEST)"
        raise UsageError(f"--protocol {protocol!r}: no such protocol; the protocols are: {known}{hint}")
    return comp


class EncoderSink:
    """An event sink (call it with each event, on the loop) that renders one run through an encoder plugin."""

    def __init__(self, host: PluginHost, protocol: str, write: Write, *, run_id: str, options: RunOptions,
                 tasks: Tasks) -> None:
        self.component = encoder_for(host, protocol)
        self.content_type = self.component.content_type
        self._process = host.process(self.component.plugin, options)
        self._config = host.configs.get(self.component.component_type)
        self._write = write
        self.run_id = run_id
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()  # None: the run ended
        self._task = tasks.start(self._drain())  # the run's: its end stops it
        self._error: BaseException | None = None
        self._waiting: dict[str, Any] | None = None

    def __call__(self, event: Event) -> None:
        if event.type == "waiting":
            # The run stopped without a final state: finishEncode must not render an empty one as its result.
            self._waiting = event.to_dict()["waiting_for"]
        self._queue.put_nowait(event)

    def _emit(self, value: Any, where: str) -> None:
        if value is None or value == {}:
            return
        data = value.get("data") if isinstance(value, dict) else None
        if not isinstance(data, str):
            raise PluginError(self.component.plugin, f"{self.component.component_type} answered {where} without "
                                                     "a 'data' string; answer {\"data\": \"...\"}")
        if data:
            self._write(data)

    async def _call(self, method: str, params: dict[str, Any]) -> None:
        body = {"run": self.run_id, "component": self.component.component_type, "config": self._config, **params}
        try:
            result = await self._process.call(method, body, on_partial=lambda p: self._emit(p, method))
        except PluginCallError as exc:
            raise PluginError(self.component.plugin,
                              f"{self.component.component_type} failed {method}: {exc}") from None
        self._emit(result, method)

    async def _drain(self) -> None:
        while True:
            event = await self._queue.get()
            if event is None:
                return
            if self._error is not None:
                continue  # the output is already broken; the error is reported at the end
            try:
                await self._call("encode", {"event": event.to_dict()})
            except (PluginError, RunError) as exc:
                self._error = exc

    async def finish(self, *, state: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        """Send the rest of the events, then finishEncode; raise the first failure of the encoder."""
        self._queue.put_nowait(None)
        await self._task
        if self._error is not None:
            raise self._error
        outcome: dict[str, Any] = {"state": state} if self._waiting is None else {"waiting": self._waiting}
        if error is not None:
            outcome = {"error": {"kind": getattr(error, "kind", "error"), "message": str(error)}}
        await self._call("finishEncode", outcome)
