"""A plugin's store component: found by name, refused when it answers what the protocol does not
say. (It keeps sessions like every store: tests/sessions/test_stores.py runs it too.)"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from heddle.errors import StoreUnavailable, UsageError
from heddle.plugin_host.errors import PluginLoadError
from heddle.plugin_host.host import PluginHost
from heddle.plugin_host.manifest import load_manifest
from heddle.sessions.open import open_store
from tests.sessions.support import SESSION_KEY, STORE_PLUGIN, Synced, synced

KEYED = {"HEDDLE_SESSION_KEY": SESSION_KEY}

# Speaks the protocol by hand, so it can answer what heddle.plugin never would.
_LIAR = textwrap.dedent('''\
    import json, sys
    for line in sys.stdin:
        msg = json.loads(line)
        method, params = msg["method"], msg.get("params") or {}
        mode = (params.get("config") or {}).get("mode")
        if method == "init":
            result = {"protocol": 1}
        elif method == "shutdown":
            print(json.dumps({"id": msg["id"], "result": {}}), flush=True)
            break
        elif method == "store.open" and mode == "down":
            print(json.dumps({"id": msg["id"], "error": {"message": "cannot reach the\\nbackend at db:1"}}), flush=True)
            continue
        elif method == "store.open":
            result = {}
        elif method == "store.get" and mode == "wrong-id":
            result = {"session": {"id": "someone-else", "version": 1, "data": "{}", "updated": 1.0}}
        elif method == "store.replace" and mode == "skips":
            result = {"replaced": {"version": params["version"] + 2, "updated": 1.0}}
        elif method == "store.list" and mode == "garbage":
            result = {"sessions": "all of them"}
        else:
            result = {"whatever": True}
        print(json.dumps({"id": msg["id"], "result": result}), flush=True)
    ''')


def _liar(tmp_path: Path) -> Path:
    folder = tmp_path / "liar"
    folder.mkdir()
    (folder / "liar.py").write_text(_LIAR)
    (folder / "plugin.json").write_text(json.dumps({
        "name": "liar", "version": "1", "command": ["python3", "liar.py"],
        "components": [{"componentType": "LiarStore", "kind": "store",
                        "configSchema": {"type": "object", "properties": {"mode": {"type": "string"}}}}]}))
    return folder / "plugin.json"


def _open_liar(tmp_path: Path, mode: str) -> Synced:
    host = PluginHost.load([_liar(tmp_path)], config_specs=[f'LiarStore={{"mode": "{mode}"}}'])
    return synced("plugin:LiarStore", plugins=host, environ=KEYED)


def test_a_store_that_cannot_open_is_one_line_naming_the_plugin(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        _open_liar(tmp_path, "down")
    assert str(caught.value) == ("plugin liar (LiarStore): store.open failed: cannot reach the backend at db:1")


@pytest.mark.parametrize(("mode", "call", "said"), [
    ("wrong-id", lambda s: s.get("mine"), "answered store.get with {'session': {'id': 'someone-else'"),
    ("skips", lambda s: s.replace("mine", b"{}", version=3), "answered store.replace with {'replaced': {'version': 5"),
    ("garbage", lambda s: s.list(), "answered store.list with {'sessions': 'all of them'}"),
    ("other", lambda s: s.delete("mine"), "answered store.delete with {'whatever': True}"),
])
def test_answers_outside_the_protocol_are_refused(tmp_path: Path, mode: str, call: Callable[[Synced], object],
                                                  said: str) -> None:
    store = _open_liar(tmp_path, mode)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            call(store)
        assert str(caught.value).startswith(f"plugin liar (LiarStore): {said}") and "\n" not in str(caught.value)
    finally:
        store.close()


def test_a_store_is_named_by_its_type_or_its_plugin(tmp_path: Path) -> None:
    config = json.dumps({"path": str(tmp_path / "s.db")})
    host = PluginHost.load([STORE_PLUGIN], config_specs=[f"SqliteSessions={config}"])
    for spec in ("plugin:SqliteSessions", "plugin:sqlite-sessions"):
        store = synced(spec, plugins=host, environ=KEYED)
        assert store.name == "plugin sqlite-sessions (SqliteSessions)"
        store.close()
    with pytest.raises(UsageError, match=r"no loaded plugin has a store 'Nope'; the loaded store components are: "
                                         r"SqliteSessions \(plugin sqlite-sessions\)"):
        open_store("plugin:Nope", plugins=host, environ=KEYED)
    with pytest.raises(UsageError, match="load one with --plugin MANIFEST"):
        open_store("plugin:Nope", environ=KEYED)
    # the settings its schema requires are checked before anything starts
    with pytest.raises(PluginLoadError, match="'path' is a required property"):
        open_store("plugin:SqliteSessions", plugins=[load_manifest(STORE_PLUGIN)], environ=KEYED)


def test_a_store_component_has_no_fields_of_other_kinds(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "s.py").write_text("")
    (folder / "plugin.json").write_text(json.dumps({
        "name": "p", "version": "1", "command": ["python3", "s.py"],
        "components": [{"componentType": "S", "kind": "store", "protocol": "x"}]}))
    with pytest.raises(PluginLoadError, match="unknown field 'protocol'; a store component has: componentType, kind"):
        load_manifest(folder)
