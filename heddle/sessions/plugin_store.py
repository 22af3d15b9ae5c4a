"""A session store a plugin provides: a `store` component (`--session-store plugin:NAME`).

The plugin's process answers `store.open/get/create/replace/delete/list` over the plugin protocol
(docs/sessions.md has each request and answer; heddle.plugin's `Plugin.store` serves them). The
process is started, and answers `store.open`, on the first call (or `open`), on the caller's event
loop, and every call awaits its answer there.
Records travel as JSON text (they are canonical JSON) and every answer is checked: a plugin that
answers what the protocol does not say is refused, never guessed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from heddle.errors import SessionError, StoreUnavailable, UsageError
from heddle.plugin_host import PLUGIN_TIMEOUT_S
from heddle.plugin_host.config import resolve_configs
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.host import PluginHost
from heddle.plugin_host.launch import Launch, plan_launch
from heddle.plugin_host.process import PluginCallError, PluginProcess
from heddle.sessions.store import (
    MAX_SESSION_BYTES,
    Index,
    Stored,
    check_session_id,
    check_size,
    conflict,
    exists,
    not_found,
)
from heddle.workspace.sandbox import SandboxPolicy

if TYPE_CHECKING:
    from heddle.plugin_host.manifest import Component, PluginManifest

# A record in a JSON string may take twice its bytes (every quote and backslash escaped).
_MAX_LINE = 2 * MAX_SESSION_BYTES + (1 << 20)


def open_plugin_store(name: str, plugins: PluginHost | Sequence[PluginManifest] | None) -> PluginStore:
    """The store component `name` (its componentType, or the name of a plugin with one store)."""
    host: PluginHost | None = None
    if isinstance(plugins, PluginHost):
        host, manifests = plugins, list(plugins.manifests.values())
    else:
        manifests = list(plugins or ())
    stores = [c for m in manifests for c in m.components if c.kind == "store"]
    chosen = [c for c in stores if c.component_type == name]
    if not chosen:
        chosen = [c for c in stores if c.plugin == name]
    if len(chosen) != 1:
        known = ", ".join(sorted(f"{c.component_type} (plugin {c.plugin})" for c in stores))
        if len(chosen) > 1:
            raise UsageError(f"--session-store plugin:{name}: plugin {name!r} has {len(chosen)} store components; "
                               "name one by its componentType: " + known)
        hint = f"the loaded store components are: {known}" if known else (
            "no loaded plugin has a store component; load one with --plugin MANIFEST")
        raise UsageError(f"--session-store plugin:{name}: no loaded plugin has a store {name!r}; {hint}")
    component = chosen[0]
    manifest = next(m for m in manifests if m.name == component.plugin)
    if host is not None:
        config = host.configs.get(component.component_type)
        timeout = host.timeout
    else:
        config = resolve_configs({component.component_type: component}, {}).get(component.component_type)
        timeout = PLUGIN_TIMEOUT_S
    return PluginStore(manifest, component, config=config, timeout=timeout)


class PluginStore:
    """Sessions kept by a plugin's store component, through a process of its own."""

    def __init__(self, manifest: PluginManifest, component: Component, *, config: Any = None,
                 timeout: float = 30.0) -> None:
        self.name = f"plugin {component.plugin} ({component.component_type})"
        self._component = component
        self._config = config
        self._home = Path(os.path.realpath(tempfile.mkdtemp(prefix=f"heddle-store-{component.plugin}-")))
        self._closed = False
        self._process = self._make_process(manifest, timeout)
        # The process `store.open` was answered by: a process started again (it died, or the caller
        # is on another event loop than the last one) opens the store again before anything else.
        self._opened_pid: int | None = None
        self._opening: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    async def open(self) -> None:
        """Start the plugin's process and have it open the store (StoreUnavailable when it cannot)."""
        if self._opened():
            return
        loop = asyncio.get_running_loop()
        if self._opening is None or self._opening[0] is not loop:
            self._opening = (loop, asyncio.Lock())
        async with self._opening[1]:
            if not self._opened():
                await self._request("store.open", {}, expect={})
                self._opened_pid = self._process.pid

    def _opened(self) -> bool:
        return self._process.alive and self._process.pid == self._opened_pid

    def _make_process(self, manifest: PluginManifest, timeout: float) -> PluginProcess:
        def launch() -> Launch:
            # Not confined: a store reaches its own database or files, which its settings name.
            return plan_launch(manifest, home=self._home, policy=SandboxPolicy())

        return PluginProcess(manifest.name, launch, timeout=timeout, capabilities=frozenset(), max_line=_MAX_LINE)

    # ------------------------------------------------------------------ calls

    async def _call(self, method: str, params: dict[str, Any], *, expect: Mapping[str, type] | None = None) -> Any:
        await self.open()
        return await self._request(method, params, expect=expect)

    async def _request(self, method: str, params: dict[str, Any], *,
                       expect: Mapping[str, type] | None = None) -> Any:
        """The plugin's answer to `method` (a dict); StoreUnavailable when it failed or answered with
        an error. With `expect`, the answer must be exactly a dict of those keys."""
        if self._closed:
            raise StoreUnavailable(f"{self.name}: the store was closed")
        body = {"component": self._component.component_type, "config": self._config, **params}
        try:
            result = await self._process.call(method, body)
        except PluginCallError as exc:
            raise StoreUnavailable(f"{self.name}: {method} failed: {' '.join(str(exc).split())}") from None
        except PluginError as exc:
            raise StoreUnavailable(f"{self.name}: {' '.join(str(exc).split())}") from None
        if expect is not None and (not isinstance(result, dict) or set(result) != set(expect)):
            self._bad(method, result)
        return result

    def _bad(self, method: str, result: Any) -> NoReturn:
        shown = repr(result)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        raise StoreUnavailable(f"{self.name}: answered {method} with {shown}, which the store protocol does not "
                               "have (docs/sessions.md)")

    def _one_of(self, method: str, result: Any, keys: tuple[str, ...]) -> tuple[str, Any]:
        """The single key of `result` (one of `keys`) and its value."""
        if not isinstance(result, dict) or len(result) != 1 or next(iter(result)) not in keys:
            self._bad(method, result)
        key = next(iter(result))
        return key, result[key]

    def _version(self, method: str, value: Any, result: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self._bad(method, result)
        return int(value)

    def _updated(self, method: str, value: Any, result: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self._bad(method, result)
        return float(value)

    def _session(self, method: str, value: Any, result: Any, session_id: str | None = None) -> Stored:
        if not isinstance(value, dict) or set(value) != {"id", "version", "data", "updated"}:
            self._bad(method, result)
        sid, data = value["id"], value["data"]
        if not isinstance(sid, str) or not isinstance(data, str) or (session_id is not None and sid != session_id):
            self._bad(method, result)
        try:
            check_session_id(sid)
        except SessionError:
            self._bad(method, result)
        return Stored(sid, self._version(method, value["version"], result), data.encode("utf-8"),
                      self._updated(method, value["updated"], result))

    @staticmethod
    def _text(session_id: str, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SessionError(f"session {session_id!r}: its record is not UTF-8 text; a plugin store keeps "
                               "JSON records") from None

    # ------------------------------------------------------------------ the protocol

    async def get(self, session_id: str) -> Stored | None:
        check_session_id(session_id)
        result = await self._call("store.get", {"id": session_id})
        _, value = self._one_of("store.get", result, ("session",))
        return None if value is None else self._session("store.get", value, result, session_id)

    async def create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        result = await self._call("store.create", {"id": session_id, "data": self._text(session_id, data)})
        key, value = self._one_of("store.create", result, ("created", "exists"))
        if key == "exists":
            if value is not True:
                self._bad("store.create", result)
            raise exists(session_id, store=self.name)
        if not isinstance(value, dict) or set(value) != {"version", "updated"} or value["version"] != 1:
            self._bad("store.create", result)
        return Stored(session_id, 1, data, self._updated("store.create", value["updated"], result))

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        result = await self._call("store.replace", {"id": session_id, "data": self._text(session_id, data),
                                              "version": version})
        key, value = self._one_of("store.replace", result, ("replaced", "conflict", "missing"))
        if key == "missing":
            if value is not True:
                self._bad("store.replace", result)
            raise not_found(session_id, store=self.name)
        if not isinstance(value, dict):
            self._bad("store.replace", result)
        if key == "conflict":
            if set(value) != {"version"}:
                self._bad("store.replace", result)
            found = self._version("store.replace", value["version"], result)
            if found == version:  # a conflict at the very version asked for is no conflict
                self._bad("store.replace", result)
            raise conflict(session_id, version, found, store=self.name)
        # The next version and no other: anything else would be a swap that did not compare.
        if set(value) != {"version", "updated"} or value["version"] != version + 1:
            self._bad("store.replace", result)
        return Stored(session_id, version + 1, data, self._updated("store.replace", value["updated"], result))

    async def delete(self, session_id: str) -> bool:
        check_session_id(session_id)
        result = await self._call("store.delete", {"id": session_id})
        _, value = self._one_of("store.delete", result, ("deleted",))
        if not isinstance(value, bool):
            self._bad("store.delete", result)
        return bool(value)

    async def list(self) -> list[Stored]:
        result = await self._call("store.list", {})
        _, value = self._one_of("store.list", result, ("sessions",))
        if not isinstance(value, list):
            self._bad("store.list", result)
        found = [self._session("store.list", item, result) for item in value]
        if len({s.id for s in found}) != len(found):
            self._bad("store.list", result)
        found.sort(key=lambda s: (-s.updated, s.id))
        return found

    async def index(self) -> Index:
        # The protocol has no lighter listing: a plugin's store answers with the records too.
        return [(s.id, s.updated) for s in await self.list()]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(Exception):
                await self._process.close()
        finally:
            shutil.rmtree(self._home, ignore_errors=True)
