"""What a path inside a bundle may look like, and when two paths are one.

A path that is harmless on the packing machine can still land somewhere else on the
machine that unpacks it: `..` climbs, a backslash is a separator on Windows, `CON` is a
device there, and `Skills/A.md` and `skills/a.md` are one file on a case-insensitive disk.
So the rules are written for the strictest file system a bundle may reach, and a path that
breaks one is refused, never rewritten.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import itemgetter

MAX_COMPONENT_BYTES = 255

_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
_WINDOWS_DEVICES |= {f"{base}{n}" for base in ("COM", "LPT") for n in "123456789\u00b9\u00b2\u00b3"}
_FORBIDDEN = re.compile('[<>:"|?*]')
_DOT_COMPONENT = re.compile(r"(?:^|/)\.\.?(?:/|$)")
_TRAILING = re.compile(r"[ .](?:/|$)")
_DEVICE = re.compile(
    r"(?:^|/)(?:CON|PRN|AUX|NUL|CONIN\$|CONOUT\$|COM[1-9\u00b9\u00b2\u00b3]|LPT[1-9\u00b9\u00b2\u00b3]) *(?:[./]|$)",
    re.IGNORECASE,
)


# Unicode category Cc is exactly C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def windows_reserved(component: str) -> bool:
    """`nul`, `Con.txt`, `LPT1 .log`: a device name whatever the case or extension."""
    stem = component.split(".", 1)[0].rstrip(" ")
    return stem.upper() in _WINDOWS_DEVICES


def path_problem(path: object, *, max_depth: int) -> str | None:
    """Why `path` cannot name a file in a bundle, or None when it can."""
    if not isinstance(path, str):
        return "is not a string"
    if not path:
        return "is empty"
    control = _CONTROL.search(path)
    if control is not None:
        ch = control.group()
        return "contains a NUL character" if ch == "\x00" else f"contains the control character U+{ord(ch):04X}"
    if path[0] == "/":
        return "is absolute; paths in a bundle are relative to its payload"
    if "\\" in path:
        return "contains a backslash, which is a separator on Windows; use '/'"
    if not path.isascii() and not unicodedata.is_normalized("NFC", path):
        return "is not in Unicode normal form NFC"
    depth = path.count("/") + 1
    if depth > max_depth:
        return f"is {depth} levels deep, over the cap of {max_depth}"
    # One scan of the whole path per rule; the per-component loop below runs only to
    # name the component at fault.
    if (
        "//" in path
        or path[-1] == "/"
        or _DOT_COMPONENT.search(path)
        or _FORBIDDEN.search(path)
        or _TRAILING.search(path)
        or _DEVICE.search(path)
        or (len(path) > MAX_COMPONENT_BYTES // 4
            and max(len(p.encode("utf-8")) for p in path.split("/")) > MAX_COMPONENT_BYTES)
    ):
        return _component_problem(path)
    return None


# Every character whose upper case begins with C, P, A, N or L (U+1E9A upper-cases to "A" and a
# modifier letter), so a name starting with any other is no device and need not be split and folded.
_DEVICE_INITIALS = frozenset("cCpPaAnNlL\u1e9a")
_BAD_CHARS = frozenset(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]) - {"\n"} | set('\\<>:"|?*')
_BAD_CHAR = re.compile("[" + "".join(re.escape(c) for c in sorted(_BAD_CHARS)) + "]")


def all_clean(paths: Sequence[str], *, max_depth: int) -> bool:
    """True when every path passes `path_problem`, checked over all of them at once.

    Re-opening a cached bundle is mostly this check, so it is done with passes of C over the
    joined paths (translate, substring search, a regular expression with a literal prefix),
    not a loop of regular expressions per path. False means "look closer": `path_problem`
    on each path names the one at fault.
    """
    if not paths or set(map(type, paths)) != {str} or not all(paths):
        return False
    blob = "\n".join(paths)
    if blob.count("\n") != len(paths) - 1:  # a path holds a line feed
        return False
    if not blob.isascii():
        return _all_clean_unicode(paths, blob, max_depth=max_depth)
    raw = blob.encode("ascii")
    if raw.translate(None, _ASCII_ALLOWED):  # what is left is a control character or one of '\\<>:"|?*'
        return False
    # Each path as `/a/b/c/`, lower-cased, one after another: every component between two '/'.
    slashed = (b"\n" + raw + b"\n").translate(_SLASHED_LOWER)
    # An empty component, or one ending in a space or a dot (so '.' and '..' as well).
    if b"//" in slashed or b" /" in slashed or b"./" in slashed:
        return False
    if any(device.search(slashed) for device in _ASCII_DEVICES):
        return False
    # With no empty component, a path of n components has at least 2n - 1 characters: only a
    # long path can be too deep, or hold a component over 255 bytes (characters, in ASCII).
    longest = min(2 * max_depth, MAX_COMPONENT_BYTES)
    if max(map(len, paths)) > longest:
        for path in paths:
            if len(path) > longest and (path.count("/") >= max_depth
                                        or max(map(len, path.split("/"))) > MAX_COMPONENT_BYTES):
                return False
    return True


_ASCII_ALLOWED = bytes(c for c in range(0x80) if chr(c) not in _BAD_CHARS)
_SLASHED_LOWER = bytes.maketrans(b"\n" + bytes(range(0x41, 0x5B)), b"/" + bytes(range(0x61, 0x7B)))
# A component `windows_reserved` refuses, lower-cased ASCII between two '/': a device name,
# spaces, then a dot or the component's end (the superscript digits are not ASCII). Each
# starts with a literal, which the regular expression engine searches for at C speed.
_ASCII_DEVICES = tuple(re.compile(pattern) for pattern in (
    rb"/co(?:n|nin\$|nout\$|m[1-9]) *[./]", rb"/prn *[./]", rb"/aux *[./]", rb"/nul *[./]", rb"/lpt[1-9] *[./]",
))


def _all_clean_unicode(paths: Sequence[str], blob: str, *, max_depth: int) -> bool:
    """`all_clean` of paths that are not all ASCII."""
    if _BAD_CHAR.search(blob) or not unicodedata.is_normalized("NFC", blob):
        return False
    if max(map(str.count, paths, repeat("/"))) >= max_depth:
        return False
    parts = set(blob.replace("\n", "/").split("/"))
    if "" in parts or "." in parts or ".." in parts:
        return False
    # A component of at most a quarter of 255 characters is within 255 UTF-8 bytes.
    short = MAX_COMPONENT_BYTES // 4
    if max(map(len, parts)) > short and any(len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES
                                            for part in parts if len(part) > short):
        return False
    # A name ends in a space or a dot where one stands before a separator or the end.
    if " /" in blob or "./" in blob or " \n" in blob or ".\n" in blob or blob[-1] in " .":
        return False
    # A device name is 3 to 7 characters before a dot, a space or the end.
    return not any(windows_reserved(part) for part in parts if part[0] in _DEVICE_INITIALS
                   and (len(part) <= 7 or "." in part[3:8] or " " in part[3:8]))


def collision_free(paths: Sequence[str]) -> bool:
    """True when no two paths fold to one name and no file folds to another's directory."""
    blob = "\n".join(paths)
    if blob.isascii() and blob.count("\n") == len(paths) - 1:
        keys = blob.lower().split("\n")  # `fold` of each path, in one pass
    else:
        keys = [fold(p) for p in paths]
    files = set(keys)
    if len(files) != len(keys):
        return False
    return parent_dirs(keys).isdisjoint(files)


def _component_problem(path: str) -> str:
    for part in path.split("/"):
        if part == "":
            return "has an empty component (a leading, doubled or trailing '/')"
        if part in (".", ".."):
            return f"has a {part!r} component, which could climb out of the payload"
        forbidden = _FORBIDDEN.search(part)
        if forbidden is not None:
            return f"contains {forbidden.group()!r}, which Windows cannot hold in a file name"
        if part[-1] in " .":
            return f"has the component {part!r}, which ends in a space or dot that Windows drops"
        if windows_reserved(part):
            return f"uses {part!r}, a reserved device name on Windows"
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return "is not a valid bundle path"


def fold(path: str) -> str:
    """The key under which case-insensitive or normalizing file systems see `path`."""
    if path.isascii():
        return path.lower()
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", path).casefold())


class PathSet:
    """Paths admitted so far; refuses one that would meet another on some disk."""

    def __init__(self) -> None:
        self._files: dict[str, str] = {}
        self._dirs: dict[str, str] = {}

    def add_file(self, path: str) -> str | None:
        """Admit a file path; return the problem instead when it collides."""
        key = fold(path)
        if key in self._files:
            other = self._files[key]
            if other == path:
                return f"{path!r} appears twice"
            return f"{path!r} and {other!r} are one name under case folding and NFKC"
        if key in self._dirs:
            return f"{path!r} is a file but {self._dirs[key]!r} needs it to be a directory"
        problem = self._add_parents(path, key)
        if problem is None:
            self._files[key] = path
        return problem

    def add_dir(self, path: str) -> str | None:
        key = fold(path)
        if key in self._files:
            return f"{path!r} is a directory but {self._files[key]!r} is a file of that name"
        problem = self._add_parents(path, key)
        if problem is None:
            self._dirs.setdefault(key, path)
        return problem

    def _add_parents(self, path: str, key: str) -> str | None:
        cut = key.find("/")
        while cut != -1:
            parent = key[:cut]
            if parent in self._files:
                return f"{self._files[parent]!r} is a file but {path!r} needs it to be a directory"
            self._dirs.setdefault(parent, path)
            cut = key.find("/", cut + 1)
        return None

    def __contains__(self, path: str) -> bool:
        return fold(path) in self._files


def is_within(path: str, prefix: str) -> bool:
    """`path` is `prefix` itself or lies under it, compared component-wise."""
    return path == prefix or path.startswith(prefix + "/")


def parent_dirs(paths: Iterable[str]) -> set[str]:
    # The folders files are in (one pass of C), then the folders those are in.
    out = set(map(itemgetter(0), map(str.rpartition, paths, repeat("/"))))
    out.discard("")
    for path in list(out):
        folder = path.rpartition("/")[0]
        while folder and folder not in out:
            out.add(folder)
            folder = folder.rpartition("/")[0]
    return out
