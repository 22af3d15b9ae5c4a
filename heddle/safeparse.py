"""Reading JSON and YAML that heddle did not write, within caps: nesting depth, size, and
(for YAML) the size of the tree once its aliases are expanded.

Python's json and yaml recurse once per nesting level, so a document of a few kilobytes
that only opens brackets ends in a RecursionError wherever it is read; a YAML alias makes a
few lines stand for a tree of billions of nodes. Every document heddle reads from a bundle,
a flow file or a request comes through here, so each is refused by a cap, before any
recursion, with an error its caller turns into its own outcome (a malformed bundle, an
invalid flow, a 400).

The same goes for the file a document is read from: a FIFO, a directory or a device is
refused from its stat, never opened in a way that can block or read forever.

This module stands below the engine and the bundle format: it imports neither.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.canonical import Known, loads_strict, loads_strict_members

if TYPE_CHECKING:
    import yaml

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class ParseLimits:
    """The caps, with their defaults. Bundle manifests and signatures also have byte caps of
    their own (heddle.format.limits), checked before they get here; request bodies have the
    server's body cap (heddle.server.config)."""

    # Arrays and objects (YAML sequences and mappings) inside one another. Real flows nest
    # about twenty deep; the parsers' own recursion gives out near a thousand.
    max_depth: int = 64
    # A flow document read from a file.
    max_bytes: int = 16 * MiB
    # Values once every YAML alias (or a flow's every `$component_ref`) is expanded: fewer
    # than a document of `max_bytes` could spell out, so aliases buy an attacker nothing.
    max_nodes: int = 1_000_000
    # Depth of a flow once its `$component_ref`s are replaced by what they name: each
    # reference inlines a component, so a chain of them nests deeper than the text does.
    max_resolved_depth: int = 256


DEFAULT_PARSE_LIMITS = ParseLimits()


class ParseLimitError(ValueError):
    """The document is over a cap. The message has no subject: callers put the file or field
    in front of it."""


class NotRegularFileError(OSError):
    """The path is there but is a directory, FIFO, socket or device, not a regular file."""

    def __init__(self, kind: str) -> None:
        super().__init__(errno.EINVAL, f"is {kind}, not a regular file")
        self.kind = kind


# ------------------------------------------------------------------ files


def file_kind(mode: int) -> str:
    """What a stat mode is, as a phrase for an error message."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_regular(path: str | Path) -> int:
    """A read-only descriptor on the regular file at `path` (links followed), or
    `NotRegularFileError`. Other OSErrors (no such file, permission) pass through."""
    st = os.stat(path)
    # Decided from the stat, before any open: opening a FIFO blocks until a writer comes, and
    # opening some devices has effects of its own.
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(file_kind(st.st_mode))
    # O_NONBLOCK in case the path was swapped for a FIFO since the stat; fstat then says so.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(file_kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | Path, *, max_bytes: int = DEFAULT_PARSE_LIMITS.max_bytes) -> bytes:
    """The bytes of the regular file at `path`, or `ParseLimitError` past `max_bytes`."""
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 * MiB, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise ParseLimitError(f"is over {max_bytes} bytes, the cap for a document")
    return b"".join(chunks)


# ------------------------------------------------------------------ JSON

_JSON_MARK = re.compile(r'["\[\]{}]')
# The rest of a string after its opening quote. Unambiguous, so a failed match costs one pass.
_JSON_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _where(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - text.rfind(chr(10), 0, pos)}"


_JSON_MARKS = b'"[]{}'
_JSON_NOT_MARK = bytes(sorted(set(range(256)) - set(_JSON_MARKS)))
_JSON_BYTE_STEP = [_JSON_STEP.get(chr(c), 0) for c in range(256)]


def _deepest(text: str) -> int:
    """An upper bound on how deep `text` nests, in a few passes of C over its bytes: the escapes
    that hide a quote (`\\\\`, then `\\"`) are dropped, then everything but quotes and brackets,
    then every string (an unterminated one runs to the end), and the brackets left are summed.
    Up to json's first error a backslash only ever starts an escape, so up to there this reads
    strings exactly as json does (UTF-8 bytes of other characters are never quotes or brackets)."""
    raw = text.encode("utf-8", "surrogatepass")
    if b"\\" in raw:  # a search for a byte is far cheaper than a replace that finds nothing
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = raw.translate(None, _JSON_NOT_MARK)
    # Most strings hold no bracket and leave two adjacent quotes, dropped in one replace. Left
    # with no quote, every pair it dropped was a string (the first quote can only pair with the
    # second, and so on): what is left is what lies outside them.
    outside = marks.replace(b'""', b"")
    if b'"' in outside:
        outside = b"".join(marks.split(b'"')[0::2])
    return max(accumulate(map(_JSON_BYTE_STEP.__getitem__, outside)), default=0)


def check_json_depth(text: str, max_depth: int = DEFAULT_PARSE_LIMITS.max_depth) -> None:
    """Refuse `text` if its arrays and objects nest deeper than `max_depth`.

    A text is refused only if json, reading it, would go past `max_depth` before it found an
    error: the exact walk below reads it as json does and stops where json would stop. It
    runs only when the fast bound says the text may be too deep.
    """
    # Counting the brackets settles a short text cheaply; a long one (a manifest has thousands of
    # objects) would pay two passes over it before `_deepest` makes its own anyway.
    few = len(text) <= 16 * max_depth and text.count("[") + text.count("{") <= max_depth
    if few or _deepest(text) <= max_depth:
        return
    depth = 0
    pos = 0
    search, rest = _JSON_MARK.search, _JSON_STRING_REST.match
    while (mark := search(text, pos)) is not None:
        at = mark.start()
        char = text[at]
        if char == '"':
            end = rest(text, at + 1)
            if end is None:
                return  # an unterminated string: json stops here
            pos = end.end()
            continue
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise ParseLimitError(f"nests deeper than {max_depth} levels of arrays and objects "
                                      f"(at {_where(text, at)})")
        else:
            depth -= 1
            if depth < 0:
                return  # a closing bracket with nothing open: json stops here
        pos = at + 1


def _text(data: bytes | str) -> str:
    return data.decode("utf-8") if isinstance(data, bytes) else data


class NotJSONValueError(ValueError):
    """A text json reads but that holds what JSON has no value for: a non-finite number (`NaN`,
    `Infinity`, or a literal past the largest float), or a lone surrogate in a string. The
    message has no subject, as ParseLimitError's."""


def finite_float(text: str) -> float:
    """A JSON number literal with a fraction or exponent, refused unless it is a finite float
    (json turns `1e400` into infinity without a word)."""
    value = float(text)
    if math.isfinite(value):
        return value
    raise NotJSONValueError(f"{text[:40]} is past the largest number JSON values may hold here")


def no_constant(name: str) -> Any:
    """json's `parse_constant`: `NaN`, `Infinity` and `-Infinity` are not JSON."""
    raise NotJSONValueError(f"{name} is not a JSON number; give a finite number (or null)")


# A `\uD800`-`\uDFFF` escape: the only way a JSON text written in ASCII holds half a surrogate pair.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_text(text: str, value: Any) -> None:
    """Refuse `value`, read from `text`, if a string of it holds a lone surrogate: it is no
    character, and could not be written as UTF-8 wherever the value goes next."""
    import json

    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a str made from bytes that are not UTF-8 (a command line's)
            raise NotJSONValueError(f"is not UTF-8 text (at character {exc.start + 1})") from None
    if _SURROGATE_ESCAPE.search(text) is None:
        return  # no escape can spell one: the common case, settled without walking the value
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(exc.object[exc.start])
        raise NotJSONValueError(f"holds a lone surrogate (\\u{code:04x}), which is not a character; "
                                "give UTF-8 text") from None


def json_problem(exc: ValueError) -> str:
    """What makes a text not the JSON heddle reads, for a person: json's message with its line
    and column, or the cap or value at fault."""
    import json

    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
    return str(exc)


def check_finite(value: Any) -> None:
    """Refuse a value read by another parser (a library's) that holds a non-finite number."""
    import json

    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        raise NotJSONValueError("holds a number that is not finite (NaN or an infinity)") from None


def loads_json(data: bytes | str, *, max_depth: int = DEFAULT_PARSE_LIMITS.max_depth, **options: Any) -> Any:
    """`json.loads` after the depth check; `options` go to json.loads. Non-finite numbers (unless
    `options` say how to read them) and lone surrogates are refused (NotJSONValueError)."""
    import json

    text = _text(data)
    check_json_depth(text, max_depth)
    value = json.loads(text, **{"parse_constant": no_constant, "parse_float": finite_float, **options})
    check_text(text, value)
    return value


def loads_strict_json(data: bytes | str, *, max_depth: int = DEFAULT_PARSE_LIMITS.max_depth) -> Any:
    """`canonical.loads_strict` (no duplicate keys, no non-finite number) after the depth check,
    and no lone surrogate: what heddle reads from a person, a caller or a bundle."""
    text = _text(data)
    check_json_depth(text, max_depth)
    value = loads_strict(text)
    check_text(text, value)
    return value


def loads_strict_json_members(data: bytes | str, *, max_depth: int = DEFAULT_PARSE_LIMITS.max_depth,
                              known: Known | None = None) -> tuple[Any, dict[str, str]]:
    """`loads_strict_json`, and when the value is an object, each member's value as the text writes it
    (`canonical.loads_strict_members`, with what the caller `known`s of it; the whole text is still
    checked here, its depth and its characters)."""
    text = _text(data)
    check_json_depth(text, max_depth)
    value, members = loads_strict_members(text, known=known)
    check_text(text, value)
    return value, members


# ------------------------------------------------------------------ YAML


def _children(node: yaml.Node) -> list[yaml.Node]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expanded(root: yaml.Node, limits: ParseLimits) -> None:
    """Refuse a composed YAML tree whose aliases expand past the caps or into a cycle.

    Iterative and memoised by node, so a document of a few lines that stands for billions
    of nodes costs as many steps as it has lines.
    """
    import yaml

    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, height)
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = [sizes[id(c)] for c in _children(node)]
            count = 1 + sum(k[0] for k in kids)
            height = 1 + max((k[1] for k in kids), default=0) if not isinstance(node, yaml.ScalarNode) else 0
            open_.discard(key)
            mark = node.start_mark
            if count > limits.max_nodes:
                raise ParseLimitError(f"stands for more than {limits.max_nodes} values once its aliases "
                                      f"are expanded (line {mark.line + 1}); write the values out")
            if height > limits.max_depth:
                raise ParseLimitError(f"nests deeper than {limits.max_depth} levels once its aliases are "
                                      f"expanded (line {mark.line + 1})")
            sizes[key] = (count, height)
            continue
        if key in sizes:
            continue
        if key in open_:
            mark = node.start_mark
            raise ParseLimitError(f"line {mark.line + 1}: a YAML alias refers to a node that holds it")
        open_.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


@functools.lru_cache(maxsize=8)
def _loader(limits: ParseLimits, aliases: bool) -> Callable[[str], Any]:
    import yaml

    class CappedLoader(yaml.SafeLoader):
        depth = 0

        def _next_mark(self) -> yaml.Mark:
            # PyYAML's stubs leave peek_event unannotated; the parser's events always carry a mark
            mark: yaml.Mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            return mark

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            if self.check_event(yaml.AliasEvent):
                if not aliases:
                    mark = self._next_mark()
                    raise ParseLimitError(f"line {mark.line + 1}: YAML aliases (*name) are not accepted here; "
                                          "write the value out")
                return super().compose_node(parent, index)
            if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
                return super().compose_node(parent, index)
            self.depth += 1
            try:
                if self.depth > limits.max_depth:
                    mark = self._next_mark()
                    raise ParseLimitError(f"nests deeper than {limits.max_depth} levels of sequences and "
                                          f"mappings (at line {mark.line + 1}, column {mark.column + 1})")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def get_single_node(self) -> yaml.Node | None:
            node = super().get_single_node()
            if node is not None:
                _check_expanded(node, limits)
            return node

    def load(text: str) -> Any:
        loader = CappedLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()

    return load


def load_yaml(text: str, *, limits: ParseLimits = DEFAULT_PARSE_LIMITS, aliases: bool = True) -> Any:
    """`yaml.safe_load` within the caps; `aliases=False` refuses every alias.

    Raises `ParseLimitError` over a cap and `yaml.YAMLError` for text that is not YAML.
    """
    if len(text) > limits.max_bytes:
        raise ParseLimitError(f"is over {limits.max_bytes} characters, the cap for a document")
    return _loader(limits, aliases)(text)
