"""How the store tests open each kind of store, shared with the racing processes they start
(which must not import pytest)."""

from __future__ import annotations

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
