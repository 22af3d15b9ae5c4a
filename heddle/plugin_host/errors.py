"""What goes wrong with plugins: a manifest or setting refused before anything runs, or a
plugin process that fails, hangs or answers what its seam does not admit during a run."""

from __future__ import annotations

from heddle.errors import RunError, UsageError


class PluginLoadError(UsageError):
    """A manifest, a `--plugin-config` setting or a plugin's place in a flow is wrong; nothing ran."""

    kind = "invalid_plugin"


class PluginError(RunError):
    """A plugin process failed a call: it crashed, went silent, broke the protocol or answered
    with an error or a verdict its seam refuses."""

    kind = "plugin_failed"

    def __init__(self, plugin: str, message: str) -> None:
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin


class PluginRejected(RunError):
    """A middleware's reject or fail verdict: the plugin worked, and said no."""

    kind = "plugin_rejected"
