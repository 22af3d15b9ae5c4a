"""Plugins: folders with a `plugin.json` manifest and a program in any language, run in their
own process and spoken to in JSON Lines. They add node types, tools, middleware at five
seams, and encoders of the event stream. See docs/plugins.md.

Names are imported on first use, so `import heddle.plugin_host` costs nothing until a plugin is
loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# How long a plugin call may stay silent (`--plugin-timeout`) and how often a node runs when a nodeError
# plugin asks to retry it (`--max-node-attempts`): written here, where the flag table reads them cheaply.
PLUGIN_TIMEOUT_S, MAX_NODE_ATTEMPTS = 30.0, 3

_EXPORTS = {
    "PluginHost": "heddle.plugin_host.host",
    "PluginManifest": "heddle.plugin_host.manifest",
    "Component": "heddle.plugin_host.manifest",
    "PluginTool": "heddle.plugin_host.manifest",
    "load_manifest": "heddle.plugin_host.manifest",
    "manifest_schema": "heddle.plugin_host.manifest",
    "PluginRun": "heddle.plugin_host.middleware",
    "PluginProcess": "heddle.plugin_host.process",
    "EncoderSink": "heddle.plugin_host.encoder",
    "PluginEvent": "heddle.plugin_host.events",
    "PluginLog": "heddle.plugin_host.events",
    "PluginError": "heddle.plugin_host.errors",
    "PluginLoadError": "heddle.plugin_host.errors",
    "PluginRejected": "heddle.plugin_host.errors",
    "PROTOCOL_VERSION": "heddle.plugin_host.protocol",
}

__all__ = [
    "PROTOCOL_VERSION",
    "Component",
    "EncoderSink",
    "PluginError",
    "PluginEvent",
    "PluginHost",
    "PluginLoadError",
    "PluginLog",
    "PluginManifest",
    "PluginProcess",
    "PluginRejected",
    "PluginRun",
    "PluginTool",
    "load_manifest",
    "manifest_schema",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'heddle.plugin_host' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from heddle.plugin_host.encoder import EncoderSink
    from heddle.plugin_host.errors import PluginError, PluginLoadError, PluginRejected
    from heddle.plugin_host.events import PluginEvent, PluginLog
    from heddle.plugin_host.host import PluginHost
    from heddle.plugin_host.manifest import Component, PluginManifest, PluginTool, load_manifest, manifest_schema
    from heddle.plugin_host.middleware import PluginRun
    from heddle.plugin_host.process import PluginProcess
    from heddle.plugin_host.protocol import PROTOCOL_VERSION
