"""Reading a plugin's `plugin.json`: checked by its JSON Schema, then by the rules a schema
cannot say (names used twice, paths that leave the folder, programs that are missing).

Reading a manifest runs nothing: a bundle carries plugins as data, and whoever runs it
decides whether to start them. Every refusal is one line naming the file and the field.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from heddle.agentspec.components import KNOWN_COMPONENT_TYPES
from heddle.canonical import CanonicalJSONError, fingerprint
from heddle.egress import EgressError, parse_section
from heddle.plugin_host.errors import PluginLoadError
from heddle.safeparse import ParseLimitError, loads_strict_json

if TYPE_CHECKING:
    from collections.abc import Mapping

    from heddle.egress import Rule

MANIFEST_NAME = "plugin.json"
CAPABILITIES = ("runTool", "callModel", "emitEvent", "log")

Kind = Literal["node", "middleware", "encoder", "store"]
Phase = Literal["before", "after"]

# Each seam with the phases it has: nodeError happens only after a node failed.
SEAM_PHASES: dict[str, tuple[Phase, ...]] = {
    "node": ("before", "after"),
    "nodeError": ("after",),
    "toolCall": ("before", "after"),
    "modelCall": ("before", "after"),
    "agentRound": ("before", "after"),
}

_FIELDS_BY_KIND = {
    "node": ("componentType", "kind", "description", "configSchema", "inputs", "outputs", "branches"),
    "middleware": ("componentType", "kind", "description", "configSchema", "seams"),
    "encoder": ("componentType", "kind", "description", "configSchema", "protocol", "contentType"),
    # a session store (--session-store plugin:NAME), answering store.* requests: docs/sessions.md
    "store": ("componentType", "kind", "description", "configSchema"),
}


@dataclass(frozen=True)
class Component:
    """One component a plugin declares. Fields that do not belong to its kind stay empty."""

    plugin: str
    component_type: str
    kind: Kind
    description: str = ""
    config_schema: dict[str, Any] | None = None
    # node
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    branches: tuple[str, ...] = ("next",)
    # middleware: (seam, phase) pairs
    seams: frozenset[tuple[str, Phase]] = frozenset()
    # encoder
    protocol: str = ""
    content_type: str = ""

    def label(self) -> str:
        return f"plugin {self.plugin!r} ({self.component_type})"


@dataclass(frozen=True)
class PluginTool:
    """A tool a plugin provides: an executable in its folder, or answered by its process."""

    plugin: str
    name: str
    description: str
    input_schema: dict[str, Any]
    path: Path | None = None
    component_type: str | None = None
    shadows: bool = False
    where: str = ""  # "tools[i]", for messages
    # Listed by the plugin's process when asked (listTools, under --discover-tools), not by its
    # manifest: answered by the process, never shadowing another tool.
    discovered: bool = False

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.input_schema)


@dataclass(frozen=True)
class PluginManifest:
    """A checked manifest. `root` is the plugin folder (resolved); paths in it are inside it."""

    path: Path
    root: Path
    name: str
    version: str
    command: tuple[str, ...]
    program: Path  # the command's program, inside root
    description: str = ""
    capabilities: frozenset[str] = frozenset()
    components: tuple[Component, ...] = ()
    tools: tuple[PluginTool, ...] = ()
    files: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    discover_tools: bool = False  # its process lists more tools when asked (--discover-tools)
    # The hosts each of its tools (or its process, by the plugin's name) may reach (heddle.egress).
    egress: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.data)


# --------------------------------------------------------------------------- reading


@lru_cache(maxsize=1)
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (draft 2020-12), as shipped beside this module."""
    schema: dict[str, Any] = json.loads((Path(__file__).parent / "manifest.schema.json").read_text(encoding="utf-8"))
    return schema


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _unexpected(message: str) -> list[str]:
    # jsonschema names the unexpected keys in its message: "('a', 'b' were unexpected)".
    inside = message[message.rfind("(") :] if "(" in message else message
    return re.findall(r"'([^']*)'", inside)


def _schema_problem(error: Any, data: Any) -> str:
    where = _field(error.absolute_path)
    if error.validator in ("additionalProperties", "unevaluatedProperties"):
        names = _unexpected(error.message)
        instance = error.instance if isinstance(error.instance, dict) else {}
        kind = instance.get("kind")
        if kind in _FIELDS_BY_KIND:
            allowed = _FIELDS_BY_KIND[kind]
            what = f"a {kind} component has"
        else:
            allowed = tuple(error.schema.get("properties", {}))
            what = "the fields are"
        shown = ", ".join(repr(n) for n in names) or "a field"
        prefix = "" if where == "(top level)" else f"{where}: "
        return f"{prefix}unknown field {shown}; {what}: {', '.join(a for a in allowed if a != '$schema')}"
    if error.validator == "required":
        names = _unexpected(error.message)
        missing = names[0] if names else "a field"
        prefix = "" if where == "(top level)" else f"{where}."
        return f"{prefix}{missing} is missing; add it"
    if error.validator == "oneOf" and isinstance(error.instance, dict) and "inputSchema" in error.instance:
        return (f"{where}: give exactly one of 'path' (an executable in the plugin folder) or 'componentType' "
                "(answered by the plugin process)")
    if error.validator == "enum":
        choices = ", ".join(str(v) for v in error.validator_value)
        return f"{where}: {error.instance!r} is not one of {choices}"
    if error.validator == "pattern":
        return f"{where}: {error.instance!r} does not match {error.validator_value}"
    return f"{where}: {error.message}"


def _check_schema(data: Any, source: str) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(manifest_schema())
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    real = [e for e in errors if e.validator != "unevaluatedProperties"]

    def echo(error: Any) -> bool:
        # A field a failing subschema covered also counts as unevaluated: that report is an echo.
        at = list(error.absolute_path)
        return error.validator == "unevaluatedProperties" and any(list(o.absolute_path)[: len(at)] == at for o in real)

    best = jsonschema.exceptions.best_match([e for e in errors if not echo(e)])
    raise PluginLoadError(f"{source}: {_schema_problem(best, data)}")


def _inside(root: Path, rel: str, *, source: str, where: str, must: str = "file") -> Path:
    """`rel` resolved inside `root`, or the refusal naming the field."""
    posix = PurePosixPath(rel)
    if posix.is_absolute() or rel.startswith("\\") or re.match(r"^[A-Za-z]:", rel):
        raise PluginLoadError(f"{source}: {where} {rel!r} is absolute; give a path inside the plugin folder")
    if ".." in posix.parts or "\\" in rel:
        raise PluginLoadError(f"{source}: {where} {rel!r} leaves the plugin folder; keep it inside {root}")
    if not posix.parts or posix.parts[0] == ".heddle":
        raise PluginLoadError(f"{source}: {where} {rel!r} cannot be used; name a file inside the plugin folder")
    path = root.joinpath(*posix.parts)
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise PluginLoadError(f"{source}: {where} {rel!r} leads out of the plugin folder (through a link); "
                              "copy the file into the folder")
    if not path.exists():
        raise PluginLoadError(f"{source}: {where} {rel!r} does not exist in {root}")
    if must == "file" and not path.is_file():
        raise PluginLoadError(f"{source}: {where} {rel!r} is not a file")
    return real


# The only programs a command may name by bare name: anything else on PATH is not sealed with
# the plugin, so what it runs would be whatever the machine has.
_INTERPRETER = re.compile(r"(?:python(?:3(?:\.[0-9]{1,2})?)?|node|sh|bash)\Z")
_INTERPRETERS = "python3 (or python, python3.N), node, sh, bash"

# The options each interpreter may take before the program's file. None of them makes it run
# code from anywhere but that file, and none takes a separate value, so the file is always the
# first argument that is not an option (which is how launch finds it).
_PYTHON_SHORT = frozenset("BbdEIOPqRsSuvx")
_SHELL_SHORT = frozenset("aefnuvx")
_SHELL_LONG = frozenset({"--noprofile", "--norc", "--posix"})
_NODE_LONG = frozenset({"--no-warnings", "--no-deprecation", "--enable-source-maps", "--trace-warnings",
                        "--trace-uncaught", "--trace-deprecation", "--throw-deprecation", "--pending-deprecation"})
_NODE_VALUED = ("--max-old-space-size=", "--stack-size=", "--unhandled-rejections=")

# Options that would run code the folder does not hold, named so the refusal can say why.
_PYTHON_CODE = {"c": "code given on the command line (-c)", "m": "a module looked up outside the folder (-m)",
                "i": "code read from stdin after the program (-i)"}
_SHELL_CODE = {"c": "code given on the command line (-c)", "s": "code read from stdin (-s)",
               "i": "start-up files of an interactive shell (-i)", "l": "start-up files of a login shell (-l)"}
_SHELL_LONG_CODE = {"--login": "start-up files of a login shell", "--rcfile": "a start-up file",
                    "--init-file": "a start-up file"}
_NODE_CODE = {"-e": "code given on the command line", "--eval": "code given on the command line",
              "-p": "code given on the command line", "--print": "code given on the command line",
              "-r": "a module loaded before the program", "--require": "a module loaded before the program",
              "--import": "a module loaded before the program", "--loader": "a module loader",
              "--experimental-loader": "a module loader", "-i": "code read from stdin",
              "--interactive": "code read from stdin", "--inspect": "code sent to a debugger port",
              "--inspect-brk": "code sent to a debugger port", "--env-file": "settings read from a file"}


def _kind(interpreter: str) -> str:
    return "python" if interpreter.startswith("python") else "node" if interpreter == "node" else "shell"


def _allowed_options(kind: str) -> str:
    if kind == "python":
        return " ".join(f"-{c}" for c in sorted(_PYTHON_SHORT))
    if kind == "shell":
        return " ".join([*(f"-{c}" for c in sorted(_SHELL_SHORT)), *sorted(_SHELL_LONG)])
    return " ".join([*sorted(_NODE_LONG), *(f"{v}N" for v in _NODE_VALUED)])


def _option_problem(kind: str, arg: str) -> str | None:
    """What is wrong with `arg`, an option before the program's file; None if it may be given."""
    unknown = "is not an option heddle lets the interpreter take before the program's file"
    if arg == "-":
        return "would run code read from stdin, which the plugin folder does not hold"
    if kind == "node":
        if arg in _NODE_LONG or (arg.startswith(_NODE_VALUED) and arg.partition("=")[2]):
            return None
        name = arg.split("=", 1)[0]
        code = _NODE_CODE.get("--inspect" if name.startswith("--inspect") else name)
        return unknown if code is None else f"would run {code}, which the plugin folder does not hold"
    if arg.startswith("--"):
        if kind == "shell" and arg in _SHELL_LONG:
            return None
        code = _SHELL_LONG_CODE.get(arg.split("=", 1)[0]) if kind == "shell" else None
        return unknown if code is None else f"would run {code}, which the plugin folder does not hold"
    # Short options run together: -Ic is -I then -c, and -cCODE is -c with its code.
    allowed, codes = (_PYTHON_SHORT, _PYTHON_CODE) if kind == "python" else (_SHELL_SHORT, _SHELL_CODE)
    for letter in arg[1:]:
        if letter in codes:
            return f"would run {codes[letter]}, which the plugin folder does not hold"
        if letter not in allowed:
            return f"holds -{letter}, which {unknown}"
    return None


def _program(root: Path, command: list[str], source: str) -> Path:
    """The program the command runs: command[0] if it is a path, else the file an allowed
    interpreter is given. Either lies inside the folder, so what runs is what is sealed."""
    first = command[0]
    if "/" in first or first.startswith("."):
        program = _inside(root, first, source=source, where="command[0]")
        if not os.access(program, os.X_OK):
            raise PluginLoadError(f"{source}: command[0] {first!r} is not executable; run chmod +x on it")
        return program
    if not _INTERPRETER.match(first):
        raise PluginLoadError(
            f"{source}: command[0] {first!r} is neither a program in the plugin folder nor an interpreter a plugin "
            f"may name; give [\"./PROGRAM\", ...] (a path in the folder) or [INTERPRETER, \"FILE\", ...] with "
            f"INTERPRETER one of {_INTERPRETERS} and FILE in the folder")
    kind = _kind(first)
    for i, arg in enumerate(command[1:], start=1):
        if not arg.startswith("-"):
            return _inside(root, arg, source=source, where=f"command[{i}]")
        problem = _option_problem(kind, arg)
        if problem is not None:
            raise PluginLoadError(
                f"{source}: command[{i}] {arg!r} {problem}; a command runs a file in the plugin folder, and before "
                f"it {first} may take only {_allowed_options(kind)}")
    raise PluginLoadError(f"{source}: command {command!r} names no program; give the program's path inside the "
                          f"plugin folder, e.g. [\"{first}\", \"plugin{_guess_ext(first)}\"]")


def _guess_ext(interpreter: str) -> str:
    return {"python": ".py", "node": ".js", "shell": ".sh"}[_kind(interpreter)]


def _unique(items: list[str], source: str, where: str, what: str) -> None:
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if item in seen:
            raise PluginLoadError(f"{source}: {where}[{i}] {what} {item!r} is already used by {where}[{seen[item]}]; "
                                  "each must be unique")
        seen[item] = i


def _check_json_schema(schema: Any, source: str, where: str) -> None:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        path = _field(exc.absolute_path)
        at = "" if path == "(top level)" else f" at {path}"
        raise PluginLoadError(f"{source}: {where} is not a valid JSON Schema{at}: {exc.message}") from None


def _component(plugin: str, i: int, raw: dict[str, Any], source: str) -> Component:
    where = f"components[{i}]"
    ctype = raw["componentType"]
    if ctype in KNOWN_COMPONENT_TYPES:
        raise PluginLoadError(f"{source}: {where}.componentType {ctype!r} is a built-in Agent Spec type; "
                              "give the plugin's component its own name")
    schema = raw.get("configSchema")
    if schema is not None:
        _check_json_schema(schema, source, f"{where}.configSchema")
    common = {"plugin": plugin, "component_type": ctype, "kind": raw["kind"],
              "description": raw.get("description", ""), "config_schema": schema}
    if raw["kind"] == "node":
        inputs, outputs = list(raw.get("inputs", [])), list(raw.get("outputs", []))
        _unique([p["title"] for p in inputs], source, f"{where}.inputs", "title")
        _unique([p["title"] for p in outputs], source, f"{where}.outputs", "title")
        branches = list(raw.get("branches", ["next"]))
        _unique(branches, source, f"{where}.branches", "branch")
        return Component(**common, inputs=tuple(inputs), outputs=tuple(outputs), branches=tuple(branches))
    if raw["kind"] == "middleware":
        pairs: dict[tuple[str, Phase], int] = {}
        for j, seam in enumerate(raw["seams"]):
            name, _, phase = seam.partition(".")
            for p in (phase,) if phase else SEAM_PHASES[name]:
                if (name, p) in pairs:
                    raise PluginLoadError(f"{source}: {where}.seams[{j}] {seam!r} repeats {name}.{p}, already given by "
                                          f"{where}.seams[{pairs[(name, p)]}]; list each seam once")
                pairs[(name, p)] = j
        return Component(**common, seams=frozenset(pairs))
    if raw["kind"] == "store":
        return Component(**common)
    if raw["protocol"] == "heddle":
        raise PluginLoadError(f"{source}: {where}.protocol 'heddle' is heddle's own event protocol; "
                              "give the encoder another name")
    return Component(**common, protocol=raw["protocol"], content_type=raw["contentType"])


def _tool(plugin: str, i: int, raw: dict[str, Any], root: Path, source: str) -> PluginTool:
    where = f"tools[{i}]"
    schema = raw["inputSchema"]
    _check_json_schema(schema, source, f"{where}.inputSchema")
    if schema.get("type", "object") != "object":
        raise PluginLoadError(f"{source}: {where}.inputSchema must describe an object (\"type\": \"object\"); "
                              "a tool takes one JSON object")
    path = None
    if "path" in raw:
        path = _inside(root, raw["path"], source=source, where=f"{where}.path")
        if not os.access(path, os.X_OK):
            raise PluginLoadError(f"{source}: {where}.path {raw['path']!r} is not executable; run chmod +x on it")
    return PluginTool(plugin=plugin, name=raw["name"], description=raw["description"], input_schema=schema,
                      path=path, component_type=raw.get("componentType"), shadows=bool(raw.get("shadows", False)),
                      where=where)


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_LISTED_FIELDS = ("name", "description", "inputSchema")


def discovered_tools(manifest: PluginManifest, answer: Any) -> tuple[PluginTool, ...]:
    """The tools a plugin's process listed when asked (`listTools`, answered
    `{"tools": [{"name", "description", "inputSchema"}, ...]}`), checked as its manifest's tools are.
    ValueError saying what is wrong with the answer."""
    import jsonschema

    listed = answer.get("tools") if isinstance(answer, dict) else None
    if not isinstance(listed, list) or set(answer) != {"tools"}:
        raise ValueError('answered listTools with something other than {"tools": [...]}; answer '
                         '{"tools": [{"name": ..., "description": ..., "inputSchema": {...}}]}')
    own = {t.name for t in manifest.tools}
    found: dict[str, PluginTool] = {}
    for i, raw in enumerate(listed):
        where = f"tools[{i}]"
        if not isinstance(raw, dict) or set(raw) != set(_LISTED_FIELDS):
            keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
            raise ValueError(f"listTools {where} has {keys}; a listed tool has exactly {', '.join(_LISTED_FIELDS)}")
        name, description, schema = raw["name"], raw["description"], raw["inputSchema"]
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ValueError(f"listTools {where}.name {name!r} does not match ^[A-Za-z0-9_-]{{1,128}}$")
        if name in own or name in found:
            other = "a tool its manifest lists" if name in own else "another tool it listed"
            raise ValueError(f"listTools {where}.name {name!r} is also {other}; each tool needs its own name")
        if type(description) is not str:
            raise ValueError(f"listTools {where}.description is not a string")
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise ValueError(f"listTools {where}.inputSchema must be a JSON Schema of an object "
                             "(\"type\": \"object\"); a tool takes one JSON object")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"listTools {where}.inputSchema is not a valid JSON Schema: {exc.message}") from None
        found[name] = PluginTool(plugin=manifest.name, name=name, description=description, input_schema=schema,
                                 where=f"listTools {where}", discovered=True)
    return tuple(found.values())


def parse_manifest(data: Any, *, path: Path) -> PluginManifest:
    """Check a parsed manifest that lives at `path` and type it."""
    source = str(path)
    root = Path(os.path.realpath(path.parent))
    _check_schema(data, source)
    name = data["name"]
    command = list(data["command"])
    program = _program(root, command, source)
    capabilities = list(data.get("capabilities", []))
    _unique(capabilities, source, "capabilities", "capability")
    raw_components = data.get("components", [])
    _unique([c["componentType"] for c in raw_components], source, "components", "componentType")
    components = tuple(_component(name, i, c, source) for i, c in enumerate(raw_components))
    protocols: dict[str, int] = {}
    for i, comp in enumerate(components):
        if comp.kind == "encoder" and comp.protocol in protocols:
            raise PluginLoadError(f"{source}: components[{i}].protocol {comp.protocol!r} is already the protocol of "
                                  f"components[{protocols[comp.protocol]}]; give each encoder its own")
        protocols.setdefault(comp.protocol, i)
    raw_tools = data.get("tools", [])
    _unique([t["name"] for t in raw_tools], source, "tools", "name")
    tools = tuple(_tool(name, i, t, root, source) for i, t in enumerate(raw_tools))
    files = [str(PurePosixPath(f)) for f in data.get("files", [])]
    _unique(files, source, "files", "path")
    for i, rel in enumerate(files):
        _inside(root, rel, source=source, where=f"files[{i}]", must="any")
    return PluginManifest(path=path, root=root, name=name, version=data["version"], command=tuple(command),
                          program=program, description=data.get("description", ""),
                          capabilities=frozenset(capabilities), components=components, tools=tools,
                          files=tuple(files), data=data, discover_tools=bool(data.get("discoverTools", False)),
                          egress=_egress(data.get("egress", {}), name, tools, source))


def _egress(value: Any, name: str, tools: tuple[PluginTool, ...], source: str) -> dict[str, tuple[Rule, ...]]:
    try:
        section = parse_section(value, f"{source}: egress")
    except EgressError as exc:
        raise PluginLoadError(str(exc)) from None
    own = {name, *(t.name for t in tools)}
    unknown = sorted(set(section) - own)
    if unknown:
        raise PluginLoadError(f"{source}: egress.{unknown[0]}: is neither one of the plugin's tools nor the plugin "
                              f"itself ({name!r})")
    return section


def load_manifest(path: str | Path) -> PluginManifest:
    """Read and check the manifest at `path` (a `plugin.json`, or a folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PluginLoadError(f"--plugin {path}: no such file; give the path of a plugin's {MANIFEST_NAME}") from None
    except UnicodeDecodeError:
        raise PluginLoadError(f"{p}: is not UTF-8 text") from None
    except OSError as exc:
        raise PluginLoadError(f"{p}: cannot be read: {exc.strerror}") from None
    try:
        data = loads_strict_json(text)
    except ParseLimitError as exc:
        raise PluginLoadError(f"{p}: {exc}") from None
    except CanonicalJSONError as exc:
        raise PluginLoadError(f"{p}: {exc}; each key may appear once") from None
    except json.JSONDecodeError as exc:
        raise PluginLoadError(f"{p}: line {exc.lineno}, column {exc.colno} is not valid JSON: {exc.msg}") from None
    return parse_manifest(data, path=p.absolute())
