"""The manifest: the one document a signature covers, naming every byte of the payload.

It is canonical JSON, so one manifest has one encoding and its sha256 (the bundle's
digest) is well defined. Reading is strict: an unknown field at any level is refused
rather than ignored, because a field this heddle skips is a promise it silently breaks.
"""

from __future__ import annotations

import functools
import operator
import posixpath
import re
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from typing import Any, ClassVar, Literal, NamedTuple, NoReturn

from heddle import canonical
from heddle.egress import MAX_RULES, EgressError, check_name, parse_rules, parse_secrets
from heddle.format.errors import (
    BundleError,
    BundleLimitError,
    MalformedBundleError,
    UnsupportedVersionError,
)
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.format.members import load_member
from heddle.format.paths import PathSet, all_clean, collision_free, is_within, parent_dirs, path_problem
from heddle.format.tar import split_name

FORMAT = "heddle-bundle"
VERSION = 1
MODES = (0o644, 0o755)
_MODE_SET = frozenset(MODES)
PAYLOAD = "payload/"
RESERVED_DEST = ".heddle"

_SHA256 = re.compile(r"[0-9a-f]{64}")
_HEX_BYTES = b"0123456789abcdef"
_FILE_KEYS = {"path", "size", "sha256", "mode"}
_FILE_FIELDS = itemgetter("path", "size", "sha256", "mode")  # in FileEntry's order
# A FileEntry's fields by index, for passes of C over every file.
_PATH, _SIZE = itemgetter(0), itemgetter(1)
_FINGERPRINT = re.compile(r"sha256:[0-9a-f]{64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

MountMode = Literal["ro", "rw"]


class FileEntry(NamedTuple):
    # A tuple, not a dataclass: every open of a bundle builds one per file (a hundred thousand).
    path: str
    size: int
    sha256: str
    mode: int

    @property
    def executable(self) -> bool:
        return self.mode == 0o755

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "path": self.path, "sha256": self.sha256, "size": self.size}


# A FileEntry from a row in its field order, built in C (the class's own constructor is Python).
_file_entry: Callable[[tuple[Any, ...]], FileEntry] = functools.partial(tuple.__new__, FileEntry)


@dataclass(frozen=True)
class ToolEntry:
    entry: str
    fingerprint: str

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.entry, "fingerprint": self.fingerprint}


@dataclass(frozen=True)
class PluginEntry:
    name: str
    dir: str
    manifest: str

    def to_json(self) -> dict[str, Any]:
        return {"dir": self.dir, "manifest": self.manifest, "name": self.name}


@dataclass(frozen=True)
class CommandEntry:
    """What a sealed command is (its file in the payload says how it runs): enough for `inspect`
    and `diff` to read from the manifest alone."""

    revision: str  # sha256: of the canonical JSON of its configuration
    fingerprint: str  # sha256: of its input schema
    expected_version: str
    adapter_version: str
    # The program it runs, as resolved when it was sealed, and the sha256 (lowercase hex) of its
    # bytes; both written together, and absent only in bundles sealed before programs were pinned.
    executable_path: str | None = None
    executable_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        pinned = {} if self.executable_path is None else {"executable_path": self.executable_path,
                                                          "executable_sha256": self.executable_sha256}
        return {"adapter_version": self.adapter_version, "expected_version": self.expected_version,
                **pinned, "fingerprint": self.fingerprint, "revision": self.revision}


@dataclass(frozen=True)
class CommandsEntry:
    """The commands file (`--commands`) sealed in the payload, and each of its commands."""

    file: str
    entries: Mapping[str, CommandEntry]

    def to_json(self) -> dict[str, Any]:
        return {"entries": {name: self.entries[name].to_json() for name in sorted(self.entries)}, "file": self.file}


@dataclass(frozen=True)
class MountEntry:
    prefix: str
    dest: str
    mode: MountMode = "ro"

    def to_json(self) -> dict[str, Any]:
        return {"dest": self.dest, "mode": self.mode, "prefix": self.prefix}


@dataclass(frozen=True)
class Requires:
    bins: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    files: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.bins or self.env or self.files)

    def to_json(self) -> dict[str, Any]:
        return {"bins": list(self.bins), "env": list(self.env), "files": list(self.files)}


@dataclass(frozen=True)
class Proposals:
    """What the packer suggests for a run; the command line overrides it.

    `max_tool_rounds` is a whole number, "unlimited", or None for no proposal.
    """

    max_tool_rounds: int | Literal["unlimited"] | None = None
    # True: every run is under --safe (the tools' sandbox); None proposes nothing. Written only when
    # true, so a manifest without it is byte for byte what it was before the field existed.
    safe: Literal[True] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"max_tool_rounds": self.max_tool_rounds, **({"safe": True} if self.safe else {})}


@dataclass(frozen=True)
class Manifest:
    name: str
    flow: str
    files: tuple[FileEntry, ...]
    tools: Mapping[str, ToolEntry] = field(default_factory=dict)
    plugins: tuple[PluginEntry, ...] = ()
    mounts: tuple[MountEntry, ...] = ()
    input: Mapping[str, Any] = field(default_factory=dict)
    requires: Requires = Requires()
    proposals: Proposals = Proposals()
    heddle_version: str = ""
    version: int = VERSION
    # The file of shared components the flow document takes its references from, if any. Written
    # only when there is one, so a manifest without it is byte for byte what it always was.
    components: str | None = None
    # The commands file and its commands, if any; written only when there is one, as `components` is.
    commands: CommandsEntry | None = None
    # The release number the packer gave (`--release N`), which orders the releases of one agent;
    # written only when given, as `components` is.
    release: int | None = None
    # Per tool or component, the hosts it may reach (heddle.egress rules, canonical and sorted); None:
    # no egress declared, so no list is enforced. Written only when declared, as `components` is.
    egress: Mapping[str, tuple[str, ...]] | None = None
    # Secrets the tools use without holding them (heddle.egress.SecretSpec's JSON, by name): where the value
    # comes from at run time, the hosts it may be sent to and the header it goes in; never the value.
    # Written only when declared, as `components` is.
    secrets: Mapping[str, Mapping[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "files": [f.to_json() for f in self.files],
            "flow": self.flow,
            "format": FORMAT,
            "heddle_version": self.heddle_version,
            "input": dict(self.input),
            "mounts": [m.to_json() for m in self.mounts],
            "name": self.name,
            "plugins": [p.to_json() for p in self.plugins],
            "proposals": self.proposals.to_json(),
            "requires": self.requires.to_json(),
            "tools": {name: self.tools[name].to_json() for name in sorted(self.tools)},
            "version": self.version,
        }
        if self.components is not None:
            out["components"] = self.components
        if self.commands is not None:
            out["commands"] = self.commands.to_json()
        if self.release is not None:
            out["release"] = self.release
        if self.egress is not None:
            out["egress"] = {name: list(self.egress[name]) for name in sorted(self.egress)}
        if self.secrets is not None:
            out["secrets"] = {name: dict(self.secrets[name]) for name in sorted(self.secrets)}
        return out

    def to_bytes(self) -> bytes:
        return canonical.dumps(self.to_json())

    @property
    def total_size(self) -> int:
        return sum(map(_SIZE, self.files))

    @cached_property
    def by_path(self) -> dict[str, FileEntry]:
        return dict(zip(map(_PATH, self.files), self.files, strict=True))

    @cached_property
    def dirs(self) -> frozenset[str]:
        """Every folder of the payload: the files' parents, and theirs."""
        return frozenset(parent_dirs(map(_PATH, self.files)))

    @classmethod
    def from_bytes(cls, data: bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "manifest") -> Manifest:
        """Parse and check manifest bytes as a verifier must; raise the matching outcome."""
        if len(data) > limits.max_manifest_bytes:
            raise BundleLimitError(f"{what} is {len(data)} bytes, over the cap of {limits.max_manifest_bytes}")
        floats: list[str] = []

        def no_constants(name: str) -> NoReturn:
            raise ValueError(f"{name} is not allowed")

        def a_float(text: str) -> int:
            floats.append(text)  # refused below, once the version has had its say
            return 0

        obj = load_member(data, what=what, parse_float=a_float, parse_constant=no_constants)
        if not isinstance(obj, dict):
            raise MalformedBundleError(f"{what} is not a JSON object")
        if obj.get("format") != FORMAT:
            raise MalformedBundleError(f"{what} field format is {obj.get('format')!r}, expected {FORMAT!r}")
        version = obj.get("version")
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise UnsupportedVersionError(
                f"{what} is format version {version}; this heddle reads version {VERSION}: upgrade heddle to open it"
            )
        if floats:
            raise MalformedBundleError(
                f"{what} is not canonical JSON: it holds the float {floats[0]}; manifests hold integers only"
            )
        reader = _Reader(what, limits, MalformedBundleError)
        # The files, when every entry passes every rule (None: the field-by-field reading below
        # names what is wrong, once the encoding has had its say).
        value = obj.get("files")
        files = reader.files_at_once(value) if type(value) is list and len(value) <= limits.max_files else None
        # Re-encoding must give back the very bytes. That also refuses duplicate keys: the
        # parse kept one of them, so the re-encoding is shorter than the input.
        if not _canonical(obj, data, files):
            try:
                canonical.loads_strict(data)
            except canonical.CanonicalJSONError as exc:
                raise MalformedBundleError(f"{what} is not canonical JSON: {exc}") from None
            raise MalformedBundleError(
                f"{what} is not canonical JSON (sorted keys, no spaces, minimal escapes, UTF-8)"
            )
        return reader.manifest(obj, files=files)

    @classmethod
    def from_json(
        cls,
        obj: Any,
        *,
        limits: Limits = DEFAULT_LIMITS,
        what: str = "manifest",
        error: type[BundleError | Exception] = MalformedBundleError,
    ) -> Manifest:
        return _Reader(what, limits, error).manifest(obj)


def _files_json(files: tuple[FileEntry, ...]) -> str:
    """The canonical JSON of `files` (entries that passed `files_at_once`): keys in sorted order,
    `str` of each exact int, the strings as they are."""
    return "[" + ",".join([f'{{"mode":{mode},"path":"{path}","sha256":"{sha256}","size":{size}}}'
                           for path, size, sha256, mode in files]) + "]"


def _canonical(obj: dict[str, Any], data: bytes, files: tuple[FileEntry, ...] | None) -> bool:
    """Whether `data` is the canonical encoding of `obj`, the value parsed from it.

    With `files`, the entries `files_at_once` took from obj["files"], those are written from
    fixed pieces instead of re-encoded one by one (most of the work): `str` of an exact int is
    what json writes, and nothing in them is escaped, as the path rules refuse '"', '\\' and
    control characters and a sha256 is hex. Every other member is re-encoded by
    `canonical.dumps`, and the pieces joined as it joins them (keys in sorted order).
    """
    try:
        if files is None:
            return canonical.dumps(obj, strict=False) == data
        members = []
        for key in sorted(obj):
            value = _files_json(files) if key == "files" else canonical.dumps(obj[key], strict=False).decode("utf-8")
            members.append(canonical.dumps(key, strict=False).decode("utf-8") + ":" + value)
        # Compared as text with `data` decoded (strictly, as the parse did it): the same as
        # comparing the bytes. (A lone surrogate in a path stays in the template's text, and differs.)
        return "{" + ",".join(members) + "}" == data.decode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, escaped in the text: it has no UTF-8, so no canonical form
        return False


MAX_RELEASE = 2**53 - 1  # the largest integer every JSON reader holds exactly


class _Reader:
    """Field-by-field checks, each failure naming the field at fault."""

    TOP: ClassVar[frozenset[str]] = frozenset({
        "files", "flow", "format", "heddle_version", "input", "mounts", "name",
        "plugins", "proposals", "requires", "tools", "version",
    })
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"components", "commands", "release", "egress", "secrets"})

    def __init__(self, what: str, limits: Limits, error: type[Exception]) -> None:
        self.what = what
        self.limits = limits
        self.error = error

    def fail(self, where: str, problem: str, *, cap: bool = False) -> NoReturn:
        message = f"{self.what} {where}: {problem}"
        if cap and self.error is MalformedBundleError:
            raise BundleLimitError(message)
        raise self.error(message)

    def keys(self, obj: Any, where: str, expected: AbstractSet[str]) -> dict[str, Any]:
        if type(obj) is dict and obj.keys() == expected:
            return obj
        if not isinstance(obj, dict):
            self.fail(where, "must be a JSON object")
        unknown = sorted(set(obj) - expected)
        if unknown:
            self.fail(where, f"unknown field {unknown[0]!r}; "
                      f"this heddle reads format version {VERSION} and refuses fields it does not know")
        missing = sorted(expected - set(obj))
        if missing:
            self.fail(where, f"missing field {missing[0]!r}")
        return obj

    def text(self, value: Any, where: str, *, max_len: int = 256) -> str:
        if not isinstance(value, str) or not value:
            self.fail(where, "must be a non-empty string")
        if len(value) > max_len:
            self.fail(where, f"is longer than {max_len} characters")
        if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
            self.fail(where, "contains a control character")
        return value

    def integer(self, value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(where, "must be an integer")
        return value

    def path(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            self.fail(f"{where} ({value!r})", "is not a string")
        if value.count("/") >= self.limits.max_depth:
            self.fail(f"{where} ({value!r})", f"is more than {self.limits.max_depth} levels deep", cap=True)
        problem = path_problem(value, max_depth=self.limits.max_depth)
        if problem is not None:
            self.fail(f"{where} ({value!r})", problem)
        return value

    def manifest(self, obj: Any, *, files: tuple[FileEntry, ...] | None = None) -> Manifest:
        """The manifest `obj` describes; `files` is what `files_at_once` made of its files, if it
        was asked already."""
        present = self.OPTIONAL & set(obj) if isinstance(obj, dict) else frozenset()
        obj = self.keys(obj, "(top level)", self.TOP | present)
        if obj["format"] != FORMAT:
            self.fail("format", f"is {obj['format']!r}, expected {FORMAT!r}")
        if obj["version"] != VERSION or isinstance(obj["version"], bool):
            self.fail("version", f"is {obj['version']!r}; this heddle reads version {VERSION}")
        if files is None:
            files = self.files(obj["files"])
        by_path = set(map(_PATH, files))
        flow = self.path(obj["flow"], "flow")
        if flow not in by_path:
            self.fail("flow", f"{flow!r} is not one of the files")
        components = None
        if "components" in obj:
            components = self.path(obj["components"], "components")
            if components not in by_path:
                self.fail("components", f"{components!r} is not one of the files")
            if components == flow:
                self.fail("components", "is the flow itself; it names a second file")
        if "secrets" in obj and "egress" not in obj:
            self.fail("secrets", "is there without egress; a bundle with secrets holds an egress allow-list too")
        commands = self.commands(obj["commands"], by_path, (flow, components)) if "commands" in obj else None
        tools = self.tools(obj["tools"], by_path)
        if commands is not None:
            both = sorted(set(tools) & set(commands.entries))
            if both:
                self.fail(f"commands.entries[{both[0]!r}]", "is also one of the tools; a name is one tool")
        return Manifest(
            name=self.text(obj["name"], "name"),
            flow=flow,
            files=files,
            tools=tools,
            plugins=self.plugins(obj["plugins"], by_path),
            mounts=self.mounts(obj["mounts"]),
            input=self.input(obj["input"]),
            requires=self.requires(obj["requires"]),
            proposals=self.proposals(obj["proposals"]),
            heddle_version=self.text(obj["heddle_version"], "heddle_version", max_len=64),
            version=VERSION,
            components=components,
            commands=commands,
            release=self.release(obj["release"]) if "release" in obj else None,
            egress=self.egress(obj["egress"]) if "egress" in obj else None,
            secrets=self.secrets(obj["secrets"]) if "secrets" in obj else None,
        )

    def secrets(self, value: Any) -> dict[str, dict[str, Any]]:
        try:
            specs = parse_secrets(value, "secrets")
        except EgressError as exc:
            self.fail("secrets", str(exc))
        for name, spec in specs.items():
            if spec.to_json() != value[name]:
                self.fail(f"secrets[{name!r}]", "must be in canonical form (hosts canonical and sorted, each once; "
                                                "the header as 'Name: value'; header or query, not both)")
        return {name: spec.to_json() for name, spec in specs.items()}

    def egress(self, value: Any) -> dict[str, tuple[str, ...]]:
        if not isinstance(value, dict):
            self.fail("egress", "must be a JSON object of component name to a list of HOST[:PORT]")
        if len(value) > self.limits.max_files:
            self.fail("egress", f"names {len(value)} components, over the cap of {self.limits.max_files}", cap=True)
        out: dict[str, tuple[str, ...]] = {}
        for name, hosts in value.items():
            where = f"egress[{name!r}]"
            try:
                check_name(name, where)
                if not isinstance(hosts, list) or not hosts or len(hosts) > MAX_RULES:
                    raise EgressError(f"{where} must be a list of 1 to {MAX_RULES} HOST[:PORT] strings")
                rules = tuple(map(str, parse_rules(hosts, where)))
            except EgressError as exc:
                self.fail("egress", str(exc))
            if list(rules) != hosts:
                self.fail(where, "must list each HOST[:PORT] once, in its canonical form (lowercase, no trailing "
                                 "dot), sorted")
            out[name] = rules
        return out

    def release(self, value: Any) -> int:
        number = self.integer(value, "release")
        if not 0 <= number <= MAX_RELEASE:
            self.fail("release", f"is {number}; a release is a whole number from 0 to {MAX_RELEASE}")
        return number

    def commands(self, value: Any, files: set[str], documents: tuple[str | None, ...]) -> CommandsEntry:
        value = self.keys(value, "commands", {"file", "entries"})
        file = self.path(value["file"], "commands.file")
        if file not in files:
            self.fail("commands.file", f"{file!r} is not one of the files")
        if file in documents:
            self.fail("commands.file", f"{file!r} is the flow or its components file; it names a file of its own")
        entries = value["entries"]
        if not isinstance(entries, dict):
            self.fail("commands.entries", "must be a JSON object")
        out: dict[str, CommandEntry] = {}
        for name, item in entries.items():
            where = f"commands.entries[{name!r}]"
            self.text(name, f"{where} name", max_len=128)
            pinned = {"executable_path", "executable_sha256"}
            item = self.keys(item, where, {"revision", "fingerprint", "expected_version", "adapter_version",
                                           *(pinned if pinned & set(item if isinstance(item, dict) else ()) else ())})
            for key in ("revision", "fingerprint"):
                if not isinstance(item[key], str) or not _FINGERPRINT.fullmatch(item[key]):
                    self.fail(f"{where}.{key}", "must be 'sha256:' and 64 lowercase hex digits")
            expected = item["expected_version"]
            # A version may span lines (`--version` often prints several), so only NUL is refused.
            if not isinstance(expected, str) or not expected or len(expected) > 4096 or "\x00" in expected:
                self.fail(f"{where}.expected_version", "must be a non-empty string of at most 4096 characters")
            path, sha256 = item.get("executable_path"), item.get("executable_sha256")
            if path is not None:
                text = self.text(path, f"{where}.executable_path", max_len=4096)
                if not text.startswith("/") or posixpath.normpath(text) != text or any(c.isspace() for c in text):
                    self.fail(f"{where}.executable_path", "must be a plain absolute path without white space")
                if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
                    self.fail(f"{where}.executable_sha256", "must be 64 lowercase hex digits")
            out[name] = CommandEntry(revision=item["revision"], fingerprint=item["fingerprint"],
                                     expected_version=expected,
                                     adapter_version=self.text(item["adapter_version"], f"{where}.adapter_version",
                                                               max_len=128),
                                     executable_path=path, executable_sha256=sha256)
        return CommandsEntry(file=file, entries=out)

    def files(self, value: Any) -> tuple[FileEntry, ...]:
        if not isinstance(value, list):
            self.fail("files", "must be a list")
        if len(value) > self.limits.max_files:
            self.fail("files", f"lists {len(value)} files, over the cap of {self.limits.max_files}", cap=True)
        fast = self.files_at_once(value)
        if fast is not None:
            return fast
        seen = PathSet()
        out: list[FileEntry] = []
        total = 0
        previous = b""
        for i, item in enumerate(value):
            where = f"files[{i}]"
            item = self.keys(item, where, {"path", "size", "sha256", "mode"})
            path = self.path(item["path"], f"{where}.path")
            raw = path.encode("utf-8")
            if len(raw) + len(PAYLOAD) > 100 and split_name(PAYLOAD + path) is None:
                self.fail(f"{where}.path ({path!r})", "is too long to store in a tar header")
            if i and raw <= previous:
                self.fail(f"{where}.path ({path!r})",
                          "is out of order; files are sorted by the UTF-8 bytes of their paths, each once")
            previous = raw
            problem = seen.add_file(path)
            if problem is not None:
                self.fail(f"{where}.path", problem)
            size = self.integer(item["size"], f"{where}.size")
            if size < 0:
                self.fail(f"{where}.size", "must not be negative")
            if size > self.limits.max_file_bytes:
                self.fail(f"{where}.size ({path!r})", f"{size} bytes is over the cap of {self.limits.max_file_bytes}",
                          cap=True)
            total += size
            if total > self.limits.max_total_bytes:
                self.fail("files", f"add up to more than the cap of {self.limits.max_total_bytes} bytes", cap=True)
            sha = item["sha256"]
            if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                self.fail(f"{where}.sha256", "must be 64 lowercase hex digits")
            mode = self.integer(item["mode"], f"{where}.mode")
            if mode not in MODES:
                self.fail(f"{where}.mode", f"is {mode}; a file is 420 (0644) or 493 (0755)")
            out.append(FileEntry(path=path, size=size, sha256=sha, mode=mode))
        return tuple(out)

    def files_at_once(self, value: list[Any]) -> tuple[FileEntry, ...] | None:
        """The same checks as the loop in `files`, made over all entries together.

        A manifest can list a hundred thousand files, and re-opening a cached bundle is
        mostly this check, so each rule is one pass of C over a column (set, map, min/max,
        join) rather than a step of Python per entry. None means something is off: the loop
        then names it.
        """
        limits = self.limits
        # Objects of four keys, each of which is one of the four (KeyError): exactly those four.
        if set(map(type, value)) != {dict} or set(map(len, value)) != {len(_FILE_KEYS)}:
            return None
        try:
            rows = list(map(_FILE_FIELDS, value))
        except KeyError:
            return None
        paths, sizes, shas, modes = zip(*rows, strict=True)
        if set(map(type, sizes)) != {int} or min(sizes) < 0 or max(sizes) > limits.max_file_bytes:
            return None
        if sum(sizes) > limits.max_total_bytes:
            return None
        if set(map(type, modes)) != {int} or not set(modes) <= _MODE_SET:
            return None
        if set(map(type, shas)) != {str} or set(map(len, shas)) != {64}:
            return None
        hexes = "".join(shas)
        if not hexes.isascii() or hexes.encode("ascii").translate(None, _HEX_BYTES):
            return None
        if not all_clean(paths, max_depth=limits.max_depth):
            return None
        # Sorted by UTF-8 bytes, each once. For ASCII the strings compare as their bytes do.
        keys: tuple[str, ...] | list[bytes] = paths
        if not "".join(paths).isascii():
            try:
                keys = [p.encode("utf-8") for p in paths]
            except UnicodeEncodeError:  # a lone surrogate: no UTF-8 bytes to sort by
                return None
        if not all(map(operator.lt, keys, keys[1:])):
            return None
        if max(map(len, keys)) + len(PAYLOAD) > 100:
            long_paths = (p for p, k in zip(paths, keys, strict=True) if len(k) + len(PAYLOAD) > 100)
            if any(split_name(PAYLOAD + p) is None for p in long_paths):
                return None
        if not collision_free(paths):
            return None
        return tuple(map(_file_entry, rows))

    def tools(self, value: Any, files: set[str]) -> dict[str, ToolEntry]:
        if not isinstance(value, dict):
            self.fail("tools", "must be a JSON object")
        out: dict[str, ToolEntry] = {}
        for name, item in value.items():
            where = f"tools[{name!r}]"
            self.text(name, f"{where} name", max_len=128)
            item = self.keys(item, where, {"entry", "fingerprint"})
            entry = self.path(item["entry"], f"{where}.entry")
            if entry not in files:
                self.fail(f"{where}.entry", f"{entry!r} is not one of the files")
            fp = item["fingerprint"]
            if not isinstance(fp, str) or not _FINGERPRINT.fullmatch(fp):
                self.fail(f"{where}.fingerprint", "must be 'sha256:' and 64 lowercase hex digits")
            out[name] = ToolEntry(entry=entry, fingerprint=fp)
        return out

    def plugins(self, value: Any, files: set[str]) -> tuple[PluginEntry, ...]:
        if not isinstance(value, list):
            self.fail("plugins", "must be a list")
        names: set[str] = set()
        out: list[PluginEntry] = []
        for i, item in enumerate(value):
            where = f"plugins[{i}]"
            item = self.keys(item, where, {"name", "dir", "manifest"})
            name = self.path(item["name"], f"{where}.name")
            if "/" in name:
                self.fail(f"{where}.name", "must be a single path component")
            if name in names:
                self.fail(f"{where}.name", f"{name!r} is used by two plugins")
            names.add(name)
            if item["dir"] != f"plugins/{name}":
                self.fail(f"{where}.dir", f"must be 'plugins/{name}'")
            manifest = self.path(item["manifest"], f"{where}.manifest")
            if manifest not in files or not is_within(manifest, item["dir"]):
                self.fail(f"{where}.manifest", f"{manifest!r} is not a file inside {item['dir']!r}")
            out.append(PluginEntry(name=name, dir=item["dir"], manifest=manifest))
        return tuple(out)

    def mounts(self, value: Any) -> tuple[MountEntry, ...]:
        if not isinstance(value, list):
            self.fail("mounts", "must be a list")
        out: list[MountEntry] = []
        for i, item in enumerate(value):
            where = f"mounts[{i}]"
            item = self.keys(item, where, {"prefix", "dest", "mode"})
            dest = self.path(item["dest"], f"{where}.dest")
            if dest.split("/", 1)[0] == RESERVED_DEST:
                self.fail(f"{where}.dest", f"lands in {RESERVED_DEST}, which heddle reserves")
            if item["prefix"] != f"mounts/{dest}":
                self.fail(f"{where}.prefix", f"must be 'mounts/{dest}'")
            if item["mode"] not in ("ro", "rw"):
                self.fail(f"{where}.mode", f"is {item['mode']!r}; use 'ro' or 'rw'")
            for other in out:
                if is_within(dest, other.dest) or is_within(other.dest, dest):
                    self.fail(f"{where}.dest", f"{dest!r} overlaps the mount at {other.dest!r}")
            out.append(MountEntry(prefix=item["prefix"], dest=dest, mode=item["mode"]))
        return tuple(out)

    def input(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail("input", "must be a JSON object")
        return value

    def requires(self, value: Any) -> Requires:
        value = self.keys(value, "requires", {"bins", "env", "files"})
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("bins", "env", "files"):
            items = value[key]
            if not isinstance(items, list):
                self.fail(f"requires.{key}", "must be a list of strings")
            for j, item in enumerate(items):
                self.text(item, f"requires.{key}[{j}]", max_len=1024)
                if key == "env" and not _ENV_NAME.fullmatch(item):
                    self.fail(f"requires.env[{j}]", f"{item!r} is not an environment variable name")
            lists[key] = tuple(items)
        return Requires(**lists)

    def proposals(self, value: Any) -> Proposals:
        safe = isinstance(value, dict) and "safe" in value
        value = self.keys(value, "proposals", {"max_tool_rounds", *(("safe",) if safe else ())})
        rounds = value["max_tool_rounds"]
        if rounds is not None and rounds != "unlimited":
            rounds = self.integer(rounds, "proposals.max_tool_rounds")
            if rounds < 1:
                self.fail("proposals.max_tool_rounds", "must be 1 or more, \"unlimited\", or null")
        if safe and value["safe"] is not True:
            self.fail("proposals.safe", "must be true when present (no proposal is written as no field)")
        return Proposals(max_tool_rounds=rounds, safe=True if safe else None)
