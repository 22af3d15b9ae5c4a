"""Commands: tools declared in a file (`--commands FILE`) instead of written as programs.

A command is one fixed operation of a program already on the machine: the program, the argv
template its arguments fill, the version it must report, and the JSON Schema of its arguments.
A flow names it as it names any tool (a ServerTool of its name), and nothing downstream can tell
the difference. The file is YAML or JSON with the key `commands`, a list of entries, and optionally `egress`, the hosts
each command may reach (heddle.egress: a mapping of command name to a list of HOST[:PORT]). Each entry has
exactly these fields:

    name, description, input_schema, executable, version_probe, expected_version, argv,
    timeout_seconds, working_directory (workspace | bundle), adapter_version, output (text | json)

Everything that can be wrong with an entry is refused here, when the file is read, without
running anything: a field missing or unknown, an executable that is a shell or a launcher (the
program is named, its argv are its arguments, and nothing ever interprets them), an input schema
that is not Draft 2020-12 or has a property that is not a string, number, integer or boolean, an
argv placeholder that names no property, or one that could be absent (each argv entry renders to
exactly one argument, never zero and never split).

The executable is never looked up on the caller's PATH: it is an absolute path or a name found in
SYSTEM_PATH, resolved when the file is read (at validation, sealing and the start of a run), and the
program is pinned by the sha256 of its bytes (Program); a bundle seals the pins in its manifest. A
call runs only that file with that digest. A value that would start an argument with "-" the
program could read as an option is refused unless its schema admits it (admits_dash); templates
where that can happen are warned about (CommandSet.warnings).

A command's revision is the sha256 of the canonical JSON of its entry: any change to what it runs
changes it. Running a command is heddle.tools.command_run.
"""

from __future__ import annotations

import hashlib
import math
import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from heddle.agentspec import components as c
from heddle.agentspec.walk import document_components
from heddle.canonical import fingerprint
from heddle.egress import EgressError, parse_section
from heddle.errors import UsageError
from heddle.safeparse import NotRegularFileError, ParseLimitError, load_yaml, loads_strict_json, read_regular

if TYPE_CHECKING:
    from heddle.egress import Rule

FIELDS = ("name", "description", "input_schema", "executable", "version_probe", "expected_version", "argv",
          "timeout_seconds", "working_directory", "adapter_version", "output")
WORKING_DIRECTORIES = ("workspace", "bundle")
OUTPUTS = ("text", "json")
SCALAR_TYPES = ("string", "number", "integer", "boolean")
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

# Programs that interpret a command line of their own, or start another program: named as a
# command's executable, they would turn its argv template (and the model's arguments in it) into
# code, or hide which program runs behind the one the version probe asked.
SHELLS = frozenset({
    "sh", "bash", "rbash", "dash", "ash", "zsh", "fish", "ksh", "mksh", "oksh", "pdksh", "csh", "tcsh", "yash",
    "posh", "elvish", "nu", "pwsh", "powershell", "xonsh", "rc", "es", "osh", "ysh",
})
LAUNCHERS = frozenset({
    "env", "busybox", "toybox", "sudo", "doas", "su", "runuser", "pkexec", "nohup", "xargs", "timeout", "nice",
    "ionice", "setsid", "stdbuf", "chroot", "unshare", "nsenter", "taskset", "chrt", "setpriv", "flock", "time",
    "script", "watch", "strace", "ltrace", "firejail", "bwrap", "systemd-run", "parallel", "ssh", "expect",
    "unbuffer", "fakeroot", "proot", "numactl", "exec", "command",
})
# Multi-call programs: an applet installed as a link to them runs as the applet it is named.
MULTI_CALL = frozenset({"busybox", "toybox"})

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# `{property}` is replaced by the argument's value; `{{` and `}}` are literal braces.
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_VERSION_SUFFIX = re.compile(r"[-.\d]+$")
MAX_TEXT = 4096
MAX_TIMEOUT = 24 * 3600.0
# Where a command's executable named without a path is looked for: never the caller's PATH, which
# whoever starts heddle chooses, so a look-alike placed earlier on it cannot stand in for the program.
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
# A string property whose `pattern` starts with one of these says its value is meant to start with
# "-" (an option the author lets the model choose).
_DASH_PATTERNS = ("^-", "^\\-")
# Escapes in a character class that never stand for "-".
_CLASS_ESCAPES = frozenset("dws./_+@:")
_HASH_CHUNK = 1 << 20


def program_kind(name: str) -> str | None:
    """"a shell" or "a launcher" when the program named `name` (a base name, maybe versioned as
    `bash5` or `zsh-5.9`) is one, else None."""
    base = name.lower()
    for candidate in (base, _VERSION_SUFFIX.sub("", base)):
        if candidate in SHELLS:
            return "a shell"
        if candidate in LAUNCHERS:
            return "a launcher (it starts another program)"
    return None


@dataclass(frozen=True)
class Program:
    """The file a command runs and the sha256 (lowercase hex) of its bytes, taken when the bundle
    was sealed (`sealed`) or when the commands file was read at the start of a run."""

    path: str
    sha256: str
    sealed: bool = False


def resolve_program(executable: str) -> str | None:
    """The file `executable` names: itself when it is an absolute path, else the first executable
    file of that name in SYSTEM_PATH; None when there is none."""
    candidates = [executable] if executable.startswith("/") else [posixpath.join(d, executable) for d in SYSTEM_PATH]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


# path -> (its stat when hashed, the sha256): hashing a program each call would cost as much as
# running it, so a call stats it and hashes again only when the file is not the one hashed.
_DIGESTS: dict[str, tuple[tuple[int, ...], str]] = {}


def _identity(st: os.stat_result) -> tuple[int, ...]:
    # Any write to the file, or a file put in its place, changes one of these (ctime cannot be set
    # back by its owner).
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def program_digest(path: str) -> str:
    """The sha256 (lowercase hex) of the file at `path` (links followed, as running it does);
    OSError when it cannot be read."""
    known = _DIGESTS.get(path)
    if known is not None and known[0] == _identity(os.stat(path)):
        return known[1]
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        before = _identity(os.fstat(fh.fileno()))
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
        after = _identity(os.fstat(fh.fileno()))
    found = digest.hexdigest()
    if before == after:  # written to while read: hash it again next time
        _DIGESTS[path] = (after, found)
    else:
        _DIGESTS.pop(path, None)
    return found


def admits_dash(prop: Mapping[str, Any], value: Any) -> bool:
    """Whether a property's schema lets its value start an argument with "-": a number is a number
    (`-5` is its value, never a named option), a value its `const` or `enum` lists is one the author
    wrote, and a `pattern` starting `^-` (with no `|`) says every value is meant to be an option."""
    if prop.get("type") in ("number", "integer"):
        return True
    if ("const" in prop and prop["const"] == value) or value in prop.get("enum", ()):
        return True
    return _dash_pattern(prop.get("pattern"))


def _dash_pattern(pattern: Any) -> bool:
    """A pattern every match of which starts with "-": `^-` (or `^\\-`) and no alternative."""
    return isinstance(pattern, str) and pattern.startswith(_DASH_PATTERNS) and "|" not in pattern


def may_become_option(prop: Mapping[str, Any]) -> bool:
    """Whether some value the property's schema takes would start an argument with a "-" it does
    not admit (a string neither listed nor held by a `pattern` whose first character cannot be one)."""
    if prop.get("type") != "string" or "const" in prop or "enum" in prop:
        return False
    pattern = prop.get("pattern")
    return not isinstance(pattern, str) or not (_dash_pattern(pattern) or _first_not_dash(pattern))


def _first_not_dash(pattern: str) -> bool:
    """Whether `pattern` plainly starts every match with a character other than "-": `^` then one
    literal character or a class without "-", not optional. False when unsure."""
    if not pattern.startswith("^") or "|" in pattern:
        return False
    rest = pattern[1:]
    if rest[:1] == "[" and rest[1:2] != "^":
        i, previous = 1, ""
        while True:
            if i >= len(rest):
                return False
            ch = rest[i]
            if ch == "]" and i > 1:
                break
            if ch == "\\":
                if rest[i + 1:i + 2] not in _CLASS_ESCAPES or i + 1 >= len(rest):
                    return False
                i, previous = i + 2, ""
            elif ch == "-":
                following = rest[i + 1:i + 2]
                if not previous or following in ("", "]", "\\") or ord(previous) <= ord("-") <= ord(following):
                    return False
                i, previous = i + 2, ""
            else:
                i, previous = i + 1, ch
        after = rest[i + 1:i + 2]
    elif rest[:1].isalnum() or rest[:1] in tuple("_/@=:,%~"):
        after = rest[1:2]
    else:
        return False
    return after not in ("?", "*", "{")


@dataclass(frozen=True)
class Piece:
    """One part of an argv entry: literal text, or the property whose value goes there."""

    text: str
    placeholder: bool = False


@dataclass(frozen=True)
class Command:
    """One command entry, checked. `revision` is `sha256:<hex>` of its canonical configuration."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    executable: str
    version_probe: tuple[str, ...]
    expected_version: str
    argv: tuple[str, ...]
    timeout_seconds: float
    working_directory: Literal["workspace", "bundle"]
    adapter_version: str
    output: Literal["text", "json"]
    revision: str
    source: str  # the file it was read from, as messages name it
    config: Mapping[str, Any] = field(repr=False)
    templates: tuple[tuple[Piece, ...], ...] = field(repr=False, default=())
    # The program it runs, pinned; None only for a sealed command whose bundle pinned none and whose
    # executable is not on this machine.
    program: Program | None = None

    @property
    def input_schema_fingerprint(self) -> str:
        """The lowercase sha256 of the compact, key-sorted UTF-8 JSON of the input schema."""
        return fingerprint(self.input_schema)

    @property
    def properties(self) -> Mapping[str, Mapping[str, Any]]:
        props: Mapping[str, Mapping[str, Any]] = self.input_schema.get("properties", {})
        return props

    def describe(self) -> dict[str, Any]:
        """The command as listings show it (inspect, validate, a registry): what it is, not how it runs."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema),
                "input_schema_fingerprint": self.input_schema_fingerprint, "revision": self.revision,
                "expected_version": self.expected_version, "adapter_version": self.adapter_version,
                "output": self.output}

    def option_field(self, arguments: Mapping[str, Any]) -> str | None:
        """The property whose value would start an argument with a "-" its schema does not admit
        (admits_dash), where the program would read it as an option: an argument before a literal
        `--` entry whose text begins with that value (`--flag={x}` begins with the template's own
        text); None when there is none."""
        end = self.argv.index("--") if "--" in self.argv else len(self.argv)
        for pieces in self.templates[:end]:
            for piece in pieces:
                if not piece.placeholder:
                    break
                prop = self.properties[piece.text]
                text = _as_argument(arguments[piece.text], prop)
                if not text:
                    continue  # an empty value: the next piece starts the argument
                if text.startswith("-") and not admits_dash(prop, arguments[piece.text]):
                    return piece.text
                break
        return None

    def render(self, arguments: Mapping[str, Any]) -> list[str]:
        """The program's arguments for `arguments` (checked against the schema, defaults filled in):
        each argv entry is exactly one of them."""
        rendered: list[str] = []
        for pieces in self.templates:
            rendered.append("".join(
                _as_argument(arguments[p.text], self.properties[p.text]) if p.placeholder else p.text
                for p in pieces))
        return rendered


def _as_argument(value: Any, prop: Mapping[str, Any]) -> str:
    """A scalar argument as the text of one program argument."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and prop.get("type") == "integer" and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return json.dumps(value)
    return str(value)


@dataclass(frozen=True)
class CommandSet:
    """The commands of one file. `folder` is where a command with `working_directory: bundle`
    runs: the commands file's folder, or the payload of the bundle that seals it."""

    path: Path
    commands: Mapping[str, Command]
    folder: Path
    what: str  # how messages name the file: "--commands FILE", "the sealed commands file NAME"
    warnings: tuple[str, ...] = ()  # argv entries a value could turn into an option (such calls are refused)
    # Its `egress:` section: the hosts each command may reach (heddle.egress), sealed with the bundle.
    egress: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Command]:
        return iter(self.commands.values())

    def __len__(self) -> int:
        return len(self.commands)

    def known(self, tools: Mapping[str, Path]) -> dict[str, Path]:
        """`tools` (a tools folder's, by name) with the commands added, for checking a flow; a command
        named like one of `tools` is refused, naming both."""
        for name in sorted(self.commands):
            if name in tools:
                raise UsageError(f"{self.what}: command {name!r} has the name of the tool {tools[name]}; a flow "
                                 "names a tool by its name alone, so rename one of them")
        return {**tools, **dict.fromkeys(self.commands, self.path)}

    def problems(self, flow: c.Flow) -> list[str]:
        """What `flow` says of the commands' names that cannot be run as it says: another kind of tool
        of a command's name, or a ServerTool whose inputs the command's input schema does not take."""
        kinds = (c.ServerTool, c.RemoteTool, c.ClientTool, c.BuiltinTool, c.MCPTool)
        found: list[str] = []
        seen: set[int] = set()
        for where, tool in document_components(flow):
            if not isinstance(tool, kinds) or tool.name not in self.commands or id(tool) in seen:
                continue
            seen.add(id(tool))
            command = self.commands[tool.name]
            label = f"{where}: {tool.component_type} {tool.name!r}"
            if not isinstance(tool, c.ServerTool):
                found.append(f"{label} has the name of a command of {self.what}; a flow names a command as a "
                             "ServerTool, so rename one of them")
                continue
            titles = [p["title"] for p in tool.inputs]
            extra = [t for t in titles if t not in command.properties]
            if extra:
                found.append(f"{label}: input {extra[0]!r} is not a property of the input_schema of command "
                             f"{tool.name!r} in {self.what}; declare it there or drop it from the tool")
            required = command.input_schema.get("required", [])
            lacking = [r for r in required if r not in titles]
            if tool.inputs and lacking:
                found.append(f"{label} does not declare the input {lacking[0]!r}, which command {tool.name!r} in "
                             f"{self.what} requires; add it to the tool's inputs")
        return found

    def describe(self) -> list[dict[str, Any]]:
        return [self.commands[name].describe() for name in sorted(self.commands)]


def load_commands(path: str | os.PathLike[str]) -> list[Command]:
    """The commands of the file at `path`, in file order; UsageError naming the file, the command and
    the field at fault."""
    return list(read_commands(Path(path)))


def read_commands(path: Path, *, what: str | None = None, folder: Path | None = None,
                  error: type[Exception] = UsageError, programs: Mapping[str, Program] | None = None) -> CommandSet:
    """The commands file at `path`, read within the parse caps and checked. `what` names it in
    messages (default `--commands PATH`); `folder` is where `working_directory: bundle` runs (default:
    the file's own folder); `error` is raised for anything wrong, with a one-line message; `programs`
    pins a sealed file's programs (parse_commands)."""
    what = what or f"--commands {path}"
    try:
        data = read_regular(path)
    except FileNotFoundError:
        raise error(f"{what}: no such file; give the path of a YAML or JSON commands file") from None
    except NotRegularFileError as exc:
        raise error(f"{what}: {exc.strerror}; give the path of a YAML or JSON commands file") from None
    except ParseLimitError as exc:
        raise error(f"{what}: {exc}") from None
    except OSError as exc:
        raise error(f"{what}: cannot be read: {exc.strerror}") from None
    return parse_commands(data, path=path, what=what, folder=folder, error=error, programs=programs)


def parse_commands(data: bytes, *, path: Path, what: str, folder: Path | None = None,
                   error: type[Exception] = UsageError, programs: Mapping[str, Program] | None = None) -> CommandSet:
    """The commands of a file's bytes (JSON when its name ends in .json, else YAML).

    Each command's program is pinned: with `programs` (a sealed file's, from its manifest) to those;
    else resolved (SYSTEM_PATH, never PATH) and hashed now, and a program not there is refused. A
    sealed command its manifest pins nothing for (a bundle sealed before pins were) is resolved and
    hashed now when its program is there."""
    import dataclasses

    reader = _Reader(what, error)
    value = reader.document(data, json_text=path.suffix.lower() == ".json")
    top = reader.keys(value, "the file", ("commands", *(("egress",) if isinstance(value, dict) and "egress" in value
                                                         else ())))
    entries = top["commands"]
    if not isinstance(entries, list):
        reader.fail("commands: must be a list of command entries")
    commands: dict[str, Command] = {}
    for i, entry in enumerate(entries):
        command = reader.command(entry, i)
        if command.name in commands:
            reader.fail(f"commands[{i}]: name {command.name!r} is also the name of an earlier command; each needs "
                        "its own")
        commands[command.name] = dataclasses.replace(command, program=reader.pin(command, programs))
    return CommandSet(path=path, commands=commands, folder=(folder or path.parent).absolute(), what=what,
                      egress=reader.egress(top.get("egress", {}), commands),
                      warnings=tuple(w for command in commands.values() for w in reader.option_warnings(command)))


class _Reader:
    """Field-by-field checks of a commands file, each failure one line naming the file, the command
    and the field."""

    def __init__(self, what: str, error: type[Exception]) -> None:
        self.what = what
        self.error = error

    def fail(self, problem: str) -> NoReturn:
        raise self.error(f"{self.what}: {problem}")

    # ------------------------------------------------------------ the document

    def document(self, data: bytes, *, json_text: bool) -> Any:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.fail("is not UTF-8 text")
        try:
            if json_text:
                value = loads_strict_json(text)
            else:
                value = self.yaml(text)
        except ParseLimitError as exc:
            self.fail(str(exc))
        except ValueError as exc:  # JSON syntax, a duplicate key, NaN
            self.fail(f"is not valid JSON: {exc}")
        self.plain(value, "the file")
        return value

    def yaml(self, text: str) -> Any:
        import yaml


        try:
            # A commands file is small and flat: aliases would only hide what an entry says.
            value = load_yaml(text, aliases=False)
            # PyYAML keeps the last of two equal keys; here that is a field read and then dropped.
            self.no_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            self.fail(f"is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}")
        return value

    def no_duplicate_keys(self, node: Any) -> None:
        import yaml

        stack = [node] if node is not None else []
        while stack:
            current = stack.pop()
            if isinstance(current, yaml.MappingNode):
                keys: set[Any] = set()
                for key, value in current.value:
                    if isinstance(key, yaml.ScalarNode):
                        if key.value in keys:
                            self.fail(f"line {key.start_mark.line + 1}: the key {key.value!r} appears twice in one "
                                      "mapping; give it once")
                        keys.add(key.value)
                    stack.extend((key, value))
            elif isinstance(current, yaml.SequenceNode):
                stack.extend(current.value)

    def plain(self, value: Any, where: str) -> None:
        """JSON values only: YAML dates, sets or non-finite numbers have no canonical JSON."""
        stack: list[tuple[Any, str]] = [(value, where)]
        while stack:
            item, at = stack.pop()
            if isinstance(item, dict):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        self.fail(f"{at}: the key {key!r} is not a string; quote it")
                    stack.append((sub, f"{at}.{key}" if at != "the file" else key))
            elif isinstance(item, list):
                stack.extend((sub, f"{at}[{i}]") for i, sub in enumerate(item))
            elif isinstance(item, float) and not math.isfinite(item):
                self.fail(f"{at}: {item} is not a finite number")
            elif not (item is None or isinstance(item, str | int | float | bool)):
                self.fail(f"{at}: a {type(item).__name__} is not a JSON value; quote it")

    def keys(self, value: Any, where: str, expected: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(f"{where} must be a mapping with the keys {', '.join(expected)}")
        unknown = sorted(set(value) - set(expected))
        if unknown:
            self.fail(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(expected)}")
        missing = [k for k in expected if k not in value]
        if missing:
            self.fail(f"{where}: missing field {missing[0]!r}")
        return value

    def egress(self, value: Any, commands: Mapping[str, Command]) -> dict[str, tuple[Rule, ...]]:
        try:
            section = parse_section(value, "egress")
        except EgressError as exc:
            self.fail(str(exc))
        unknown = sorted(set(section) - set(commands))
        if unknown:
            self.fail(f"egress.{unknown[0]}: is not one of the file's commands; name a command")
        return section

    # ------------------------------------------------------------ the program and its argv

    def pin(self, command: Command, programs: Mapping[str, Program] | None) -> Program | None:
        if programs is not None and command.name in programs:
            return programs[command.name]
        where = f"command {command.name!r}: executable {command.executable!r}"
        path = resolve_program(command.executable)
        if path is None:
            if programs is not None:
                return None  # the call names what is missing; opening the bundle needs no program
            if command.executable.startswith("/"):
                self.fail(f"{where} is not an executable file on this machine; install it, or give the path of one")
            self.fail(f"{where} is in none of {':'.join(SYSTEM_PATH)} (a command's program is never looked up on "
                      "PATH); install it there, or give its absolute path")
        try:
            return Program(path, program_digest(path))
        except OSError as exc:
            if programs is not None:
                return None
            self.fail(f"{where}: {path} cannot be read to take its sha256: {exc.strerror}")

    def option_warnings(self, command: Command) -> Iterator[str]:
        """A line for each argv entry that a value of its first placeholder could make an option."""
        end = command.argv.index("--") if "--" in command.argv else len(command.argv)
        for i, pieces in enumerate(command.templates[:end]):
            if pieces and pieces[0].placeholder and may_become_option(command.properties[pieces[0].text]):
                yield (f"{self.what}: command {command.name!r}: argv[{i}] {command.argv[i]!r} starts with "
                       f"{{{pieces[0].text}}}, so a value starting with '-' would be read as an option, and a call "
                       f"given one is refused; put \"--\" in argv before it (if {command.executable} takes it), "
                       f"write it as --flag={{{pieces[0].text}}}, or give the property a pattern or an enum")

    # ------------------------------------------------------------ one entry

    def command(self, entry: Any, index: int) -> Command:
        where = f"commands[{index}]"
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and _NAME.fullmatch(entry["name"]):
            where = f"command {entry['name']!r}"
        entry = self.keys(entry, where, FIELDS)
        name = entry["name"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            self.fail(f"{where}: name {name!r} must be 1 to 64 letters, digits, '_' or '-' (a tool's name)")
        schema = self.input_schema(entry["input_schema"], where)
        templates = tuple(self.template(item, f"{where}: argv[{i}]", schema)
                          for i, item in enumerate(self.strings(entry["argv"], f"{where}: argv")))
        command = Command(
            name=name,
            description=self.text(entry["description"], f"{where}: description"),
            input_schema=schema,
            executable=self.executable(entry["executable"], f"{where}: executable"),
            version_probe=tuple(self.strings(entry["version_probe"], f"{where}: version_probe")),
            expected_version=self.expected_version(entry["expected_version"], f"{where}: expected_version"),
            argv=tuple(entry["argv"]),
            timeout_seconds=self.timeout(entry["timeout_seconds"], f"{where}: timeout_seconds"),
            working_directory=self.choice(entry["working_directory"], f"{where}: working_directory",
                                          WORKING_DIRECTORIES),  # type: ignore[arg-type]
            adapter_version=self.text(entry["adapter_version"], f"{where}: adapter_version", max_len=128),
            output=self.choice(entry["output"], f"{where}: output", OUTPUTS),  # type: ignore[arg-type]
            revision=fingerprint(entry),
            source=self.what,
            config=entry,
            templates=templates,
        )
        return command

    def text(self, value: Any, where: str, *, max_len: int = MAX_TEXT) -> str:
        if not isinstance(value, str) or not value.strip():
            shown = f" (it is {type(value).__name__}; quote it)" if isinstance(value, int | float) else ""
            self.fail(f"{where} must be a non-empty string{shown}")
        if len(value) > max_len:
            self.fail(f"{where} is longer than {max_len} characters")
        if "\x00" in value:
            self.fail(f"{where} holds a NUL character")
        return value

    def strings(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(f"{where} must be a list of strings (each one argument)")
        for i, item in enumerate(value):
            if "\x00" in item:
                self.fail(f"{where}[{i}] holds a NUL character, which no program argument can")
        return value

    def choice(self, value: Any, where: str, allowed: Sequence[str]) -> str:
        if value not in allowed or not isinstance(value, str):
            self.fail(f"{where} is {value!r}; give one of: {', '.join(allowed)}")
        return value

    def timeout(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT:
            self.fail(f"{where} is {value!r}; give a number of seconds above 0 and at most {MAX_TIMEOUT:g}")
        return float(value)

    def expected_version(self, value: Any, where: str) -> str:
        text = self.text(value, where)
        if text != text.strip():
            self.fail(f"{where} starts or ends with white space, and the probe's output is compared trimmed; "
                      "trim it")
        return text

    def executable(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(f"{where} must be the name of one program or its absolute path")
        if any(ch.isspace() for ch in value) or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            self.fail(f"{where} {value!r} holds white space or a control character; name the program alone (its "
                      "arguments go in argv, one per entry)")
        if "/" in value and (not value.startswith("/") or posixpath.normpath(value) != value):
            self.fail(f"{where} {value!r} is a relative or unnormalised path; give a program name (looked up in "
                      f"{':'.join(SYSTEM_PATH)}) or a plain absolute path")
        kind = program_kind(posixpath.basename(value))
        if kind is not None:
            self.fail(f"{where} {value!r} is {kind}; name the program it would run instead (argv are that "
                      "program's arguments and no shell ever reads them)")
        return value

    def input_schema(self, value: Any, where: str) -> dict[str, Any]:
        import jsonschema

        where = f"{where}: input_schema"
        if not isinstance(value, dict):
            self.fail(f"{where} must be a JSON Schema object")
        declared = value.get("$schema", DRAFT_2020_12)
        if declared != DRAFT_2020_12:
            self.fail(f"{where}.$schema is {declared!r}; input schemas are Draft 2020-12 ({DRAFT_2020_12})")
        try:
            jsonschema.Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            at = "".join(f"[{p!r}]" for p in exc.path)
            self.fail(f"{where}{at} is not a valid Draft 2020-12 schema: {exc.message}")
        if value.get("type") != "object":
            self.fail(f"{where}.type must be \"object\" (the arguments are one object)")
        properties = value.get("properties", {})
        if not isinstance(properties, dict):
            self.fail(f"{where}.properties must be a mapping")
        for prop_name, prop in properties.items():
            at = f"{where}.properties.{prop_name}"
            if not isinstance(prop, dict) or prop.get("type") not in SCALAR_TYPES:
                got = prop.get("type") if isinstance(prop, dict) else prop
                self.fail(f"{at}.type is {got!r}; a command's arguments are one of {', '.join(SCALAR_TYPES)} "
                          "(each fills part of one program argument)")
            if "default" in prop and not jsonschema.Draft202012Validator(prop).is_valid(prop["default"]):
                self.fail(f"{at}.default does not satisfy the property's own schema")
        for required in value.get("required", []):
            if required not in properties:
                self.fail(f"{where}.required names {required!r}, which is not one of its properties")
        return value

    def template(self, item: str, where: str, schema: Mapping[str, Any]) -> tuple[Piece, ...]:
        properties: Mapping[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        pieces: list[Piece] = []
        last = 0
        for match in _PLACEHOLDER.finditer(item):
            if match.start() > last:
                pieces.append(Piece(item[last:match.start()]))
            last = match.end()
            token = match.group(0)
            if token in ("{{", "}}"):
                pieces.append(Piece(token[0]))
                continue
            name = match.group(1)
            if name is None:
                self.fail(f"{where} {item!r} has a lone {token!r}; write {token * 2} for a literal brace")
            if name not in properties:
                self.fail(f"{where} {item!r} names {{{name}}}, which is not a property of its input_schema; declare "
                          "it there")
            if name not in required and "default" not in properties[name]:
                self.fail(f"{where} {item!r} names {{{name}}}, which a call may leave out; make it required or give "
                          "it a default (each argv entry renders to exactly one argument)")
            pieces.append(Piece(name, placeholder=True))
        if last < len(item):
            pieces.append(Piece(item[last:]))
        return tuple(pieces)
