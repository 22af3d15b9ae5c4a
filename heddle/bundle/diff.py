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
    commands_added: list[str] = field(default_factory=list)
    commands_removed: list[str] = field(default_factory=list)
    commands_changed: list[Change] = field(default_factory=list)
    # Commands whose configuration changed while their adapter_version did not: what calls them
    # cannot tell the new behaviour from the old one.
    commands_unversioned: list[str] = field(default_factory=list)
    settings_changed: list[Change] = field(default_factory=list)
    # Per component, the hosts its egress allow-list gained or lost ("*" when a bundle declares none:
    # it is not restricted at all).
    egress_changed: list[Change] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in self.__dataclass_fields__)

    def to_json(self) -> dict[str, Any]:
        def changes(items: list[Change]) -> list[dict[str, Any]]:
            return [{"what": c.what, "before": c.before, "after": c.after} for c in items]

        return {
            "files": {"added": self.files_added, "removed": self.files_removed, "changed": changes(self.files_changed)},
            "tools": {"added": self.tools_added, "removed": self.tools_removed, "changed": changes(self.tools_changed)},
            "commands": {"added": self.commands_added, "removed": self.commands_removed,
                         "changed": changes(self.commands_changed),
                         "changed_without_adapter_version": self.commands_unversioned},
            "settings": changes(self.settings_changed),
            "egress": changes(self.egress_changed),
        }

    def lines(self) -> list[str]:
        out = [f"+ file {p}" for p in self.files_added]
        out += [f"- file {p}" for p in self.files_removed]
        out += [f"~ file {c.what}: {c.before} -> {c.after}" for c in self.files_changed]
        out += [f"+ tool {t}" for t in self.tools_added]
        out += [f"- tool {t}" for t in self.tools_removed]
        out += [f"~ tool {c.what}: {c.before} -> {c.after}" for c in self.tools_changed]
        out += [f"+ command {name}" for name in self.commands_added]
        out += [f"- command {name}" for name in self.commands_removed]
        out += [f"~ command {c.what}: {_show(c.before)} -> {_show(c.after)}" for c in self.commands_changed]
        out += [f"! command {name}: its configuration changed but its adapter_version did not; raise "
                "adapter_version when a command changes" for name in self.commands_unversioned]
        out += [f"~ {c.what}: {_show(c.before)} -> {_show(c.after)}" for c in self.settings_changed]
        out += [f"~ egress {c.what}: {_show(c.before)} -> {_show(c.after)}" for c in self.egress_changed]
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
    _diff_commands(d, a, b)
    _diff_egress(d, a, b)
    ja, jb = a.to_json(), b.to_json()
    for key in ("name", "flow", "mounts", "plugins", "input", "requires", "proposals", "heddle_version"):
        if ja[key] != jb[key]:
            d.settings_changed.append(Change(key, ja[key], jb[key]))
    return d


def _diff_egress(d: BundleDiff, a: Manifest, b: Manifest) -> None:
    if (a.egress is None) != (b.egress is None):
        d.egress_changed.append(Change("(declared)", "no (any host)" if a.egress is None else "yes",
                                           "no (any host)" if b.egress is None else "yes"))
    ea, eb = a.egress or {}, b.egress or {}
    for name in sorted(set(ea) | set(eb)):
        before, after = list(ea.get(name, ())), list(eb.get(name, ()))
        if before != after:
            d.egress_changed.append(Change(name, before, after))
    sa, sb = a.secrets or {}, b.secrets or {}
    for name in sorted(set(sa) | set(sb)):
        if sa.get(name) != sb.get(name):
            d.egress_changed.append(Change(f"secret {name}", sa.get(name), sb.get(name)))


def _diff_commands(d: BundleDiff, a: Manifest, b: Manifest) -> None:
    ca = dict(a.commands.entries) if a.commands is not None else {}
    cb = dict(b.commands.entries) if b.commands is not None else {}
    d.commands_added = sorted(set(cb) - set(ca))
    d.commands_removed = sorted(set(ca) - set(cb))
    for name in sorted(set(ca) & set(cb)):
        before, after = ca[name], cb[name]
        for label, key in (("revision", "revision"), ("input-schema fingerprint", "fingerprint"),
                           ("expected_version", "expected_version"), ("adapter_version", "adapter_version"),
                           ("program", "executable_path"), ("program sha256", "executable_sha256")):
            if getattr(before, key) != getattr(after, key):
                d.commands_changed.append(Change(f"{name} {label}", getattr(before, key), getattr(after, key)))
        if before.revision != after.revision and before.adapter_version == after.adapter_version:
            d.commands_unversioned.append(name)
    fa = a.commands.file if a.commands is not None else None
    fb = b.commands.file if b.commands is not None else None
    if fa != fb:
        d.commands_changed.append(Change("commands file", fa, fb))
