"""How the store tests open each kind of store, shared with the racing processes they start
(which must not import pytest)."""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any

STORE_PLUGIN = Path(__file__).parent / "store_plugin" / "plugin.json"


# The session key every store of these tests is sealed with (the operator's, for Postgres and plugins).
SESSION_KEY = "k3y-" * 10


def store_options(where: dict[str, str]) -> dict[str, Any]:
    """open_store's keyword arguments for `where` (what the tests say about a store, as JSON can)."""
    key = {"environ": {"HEDDLE_SESSION_KEY": SESSION_KEY}}
    if "plugin" in where:
        from heddle.plugin_host.host import PluginHost

        config = json.dumps({"path": where["path"]})
        return {"plugins": PluginHost.load([where["plugin"]], config_specs=[f"SqliteSessions={config}"]), **key}
    return {**{k: Path(value) for k, value in where.items()}, **key}


class Synced:
    """A store whose calls a test makes synchronously, each on one event loop of the test's own (the
    stores are asynchronous, and a Postgres connection or a plugin's process belongs to one loop).
    Made, it has opened its store (the plugin's process answered `store.open`)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.name = store.name
        self._loop = asyncio.new_event_loop()
        try:
            self.open()
        except BaseException:
            self._loop.close()
            raise

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.store, name)
        if not inspect.iscoroutinefunction(call):
            return call

        def now(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(call(*args, **kwargs))

        return now

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed():
            loop.close()


def synced(spec: str, **options: Any) -> Synced:
    """open_store(spec, **options), its calls made synchronously."""
    from heddle.sessions.open import open_store

    return Synced(open_store(spec, **options))
