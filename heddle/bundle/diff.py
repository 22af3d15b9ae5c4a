"""What changed between two bundles: files, tools and their input-schema fingerprints, settings."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from heddle.format.manifest import Manifest


@dataclass(frozen=True)
class Change:
    what: str
    before: Any
    after: Any


@dataclass
class BundleDiff:
    files_added: list[str] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)
    files_changed: list[Change] = field(default_factory=list)
    tools_added: list[str] = field(default_factory=list)
    tools_removed: list[str] = field(default_factory=list)
    tools_changed: list[Change] = field(default_factory=list)
    settings_changed: list[Change] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in self.__dataclass_fields__)

    def to_json(self) -> dict[str, Any]:
        def changes(items: list[Change]) -> list[dict[str, Any]]:
            return [{"what": c.what, "before": c.before, "after": c.after} for c in items]

        return {
            "files": {"added": self.files_added, "removed": self.files_removed, "changed": changes(self.files_changed)},
            "tools": {"added": self.tools_added, "removed": self.tools_removed, "changed": changes(self.tools_changed)},
            "settings": changes(self.settings_changed),
        }

    def lines(self) -> list[str]:
        out = [f"+ file {p}" for p in self.files_added]
        out += [f"- file {p}" for p in self.files_removed]
        out += [f"~ file {c.what}: {c.before} -> {c.after}" for c in self.files_changed]
        out += [f"+ tool {t}" for t in self.tools_added]
        out += [f"- tool {t}" for t in self.tools_removed]
        out += [f"~ tool {c.what}: {c.before} -> {c.after}" for c in self.tools_changed]
        out += [f"~ {c.what}: {_show(c.before)} -> {_show(c.after)}" for c in self.settings_changed]
        return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _file_state(manifest: Manifest, path: str) -> str:
    item = manifest.by_path[path]
    return f"{item.size} bytes, mode {item.mode:o}, sha256 {item.sha256[:12]}"


def diff_manifests(a: Manifest, b: Manifest) -> BundleDiff:
    d = BundleDiff()
    pa, pb = a.by_path, b.by_path
    d.files_added = sorted(set(pb) - set(pa))
    d.files_removed = sorted(set(pa) - set(pb))
    for path in sorted(set(pa) & set(pb)):
        if pa[path] != pb[path]:
            d.files_changed.append(Change(path, _file_state(a, path), _file_state(b, path)))
    d.tools_added = sorted(set(b.tools) - set(a.tools))
    d.tools_removed = sorted(set(a.tools) - set(b.tools))
    for name in sorted(set(a.tools) & set(b.tools)):
        ta, tb = a.tools[name], b.tools[name]
        if ta.fingerprint != tb.fingerprint:
            d.tools_changed.append(Change(f"{name} input-schema fingerprint", ta.fingerprint, tb.fingerprint))
        if ta.entry != tb.entry:
            d.tools_changed.append(Change(f"{name} entry", ta.entry, tb.entry))
        elif ta.entry in pa and ta.entry in pb and pa[ta.entry].sha256 != pb[tb.entry].sha256:
            d.tools_changed.append(Change(f"{name} executable", pa[ta.entry].sha256[:12], pb[tb.entry].sha256[:12]))
    ja, jb = a.to_json(), b.to_json()
    for key in ("name", "flow", "mounts", "plugins", "input", "requires", "proposals", "heddle_version"):
        if ja[key] != jb[key]:
            d.settings_changed.append(Change(key, ja[key], jb[key]))
    return d
