"""Running a prepared flow with plugins loaded: the run gets an id its plugin calls name, an
encoder renders it when a protocol is asked for, and the plugin processes stop at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from heddle.engine import events as ev
from heddle.plugin_host.host import RUN_ID, PluginHost, new_run_id


def _both(first: ev.EventSink, second: ev.EventSink) -> ev.EventSink:
    def sink(event: ev.Event) -> None:
        first(event)
        second(event)

    return sink


async def run_with_plugins(prepared: Any, inputs: dict[str, Any], *, host: PluginHost,
                           on_event: ev.EventSink = ev.ignore, protocol: str | None = None,
                           write: Callable[[str], None] | None = None, close: bool = True) -> dict[str, Any]:
    """Run `prepared` (made with `plugins=host`) and return its final state.

    With `protocol`, every event is rendered by that encoder plugin and passed to `write`.
    With `close`, the plugin processes are stopped when the run ends, however it ends.
    """
    from heddle.engine import run_prepared
    from heddle.plugin_host.encoder import EncoderSink

    token = RUN_ID.set(new_run_id())
    sink: EncoderSink | None = None
    try:
        if protocol is not None:
            assert write is not None, "an encoder needs somewhere to write"
            sink = EncoderSink(host, protocol, write, run_id=RUN_ID.get() or "", options=prepared.options)
            on_event = _both(on_event, sink)
        try:
            state = await run_prepared(prepared, inputs, on_event=on_event)
        except Exception as exc:
            if sink is not None:
                with contextlib.suppress(Exception):
                    await sink.finish(error=exc)
            raise
        if sink is not None:
            await sink.finish(state=state)
        return state
    finally:
        if sink is not None:
            sink.cancel()
        RUN_ID.reset(token)
        if close:
            await host.aclose()
