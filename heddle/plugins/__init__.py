"""Plugins: folders with a `plugin.json` manifest and a program in any language, run in their
own process and spoken to in JSON Lines. They add node types, tools, middleware at five
seams, and encoders of the event stream. See docs/plugins.md.

Names are imported on first use, so `import heddle.plugins` costs nothing until a plugin is
loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "PluginHost": "heddle.plugins.host",
    "PluginManifest": "heddle.plugins.manifest",
    "Component": "heddle.plugins.manifest",
    "PluginTool": "heddle.plugins.manifest",
    "load_manifest": "heddle.plugins.manifest",
    "manifest_schema": "heddle.plugins.manifest",
    "PluginRun": "heddle.plugins.middleware",
    "PluginProcess": "heddle.plugins.process",
    "run_with_plugins": "heddle.plugins.runner",
    "EncoderSink": "heddle.plugins.encoder",
    "PluginEvent": "heddle.plugins.events",
    "PluginLog": "heddle.plugins.events",
    "PluginError": "heddle.plugins.errors",
    "PluginLoadError": "heddle.plugins.errors",
    "PluginRejected": "heddle.plugins.errors",
    "PROTOCOL_VERSION": "heddle.plugins.protocol",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'heddle.plugins' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from heddle.plugins.encoder import EncoderSink
    from heddle.plugins.errors import PluginError, PluginLoadError, PluginRejected
    from heddle.plugins.events import PluginEvent, PluginLog
    from heddle.plugins.host import PluginHost
    from heddle.plugins.manifest import Component, PluginManifest, PluginTool, load_manifest, manifest_schema
    from heddle.plugins.middleware import PluginRun
    from heddle.plugins.process import PluginProcess
    from heddle.plugins.protocol import PROTOCOL_VERSION
    from heddle.plugins.runner import run_with_plugins
