"""Canonical JSON: the one byte encoding that digests and fingerprints are computed over.

UTF-8, keys sorted by code point, no insignificant white space, integers only (a float
has more than one spelling, so it is refused), no NaN or infinities.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from json.decoder import WHITESPACE as _WHITESPACE  # type: ignore[attr-defined]
from json.decoder import JSONObject  # type: ignore[attr-defined]
from typing import Any


class CanonicalJSONError(ValueError):
    pass


def _check(value: Any, where: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        raise CanonicalJSONError(f"{where}: floats are not allowed in canonical JSON")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise CanonicalJSONError(f"{where}: object keys must be strings")
            _check(v, f"{where}.{k}")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check(v, f"{where}[{i}]")
        return
    raise CanonicalJSONError(f"{where}: {type(value).__name__} is not JSON")


def dumps(value: Any, *, strict: bool = True) -> bytes:
    """Encode `value` canonically. `strict=False` admits floats (for fingerprints of schemas)."""
    if strict:
        _check(value, "$")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(value: Any) -> str:
    """sha256 of the compact, sorted-keys UTF-8 JSON of `value`: `sha256:<hex>`."""
    return "sha256:" + sha256_hex(dumps(value, strict=False))


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Built in C; only an object that lost a pair has a duplicate to look for.
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise CanonicalJSONError(f"duplicate key {k!r}")
        seen.add(k)
    raise AssertionError("a dict shorter than its pairs has a repeated key")


def _bad_constant(name: str) -> Any:
    raise CanonicalJSONError(f"{name} is not allowed")


def _finite(text: str) -> float:
    # json reads a literal past the largest float (1e400) as infinity, without a word.
    value = float(text)
    if not math.isfinite(value):
        raise CanonicalJSONError(f"{text[:40]} is not a finite number")
    return value


# Made once (json.loads makes a decoder a call); it keeps no state between reads but its scanner's
# key memo, which each read empties, as json's own shared decoder does.
_STRICT = json.JSONDecoder(object_pairs_hook=_no_dupes, parse_constant=_bad_constant, parse_float=_finite)
_BOM = "\ufeff"


def loads_strict(data: bytes | str) -> Any:
    """Parse JSON refusing duplicate keys and non-finite numbers."""
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    if data.startswith(_BOM):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)  # as json.loads
    return _STRICT.decode(data)


# What a caller of loads_strict_members knows of a member's text: see there.
Known = Callable[[str, int], "tuple[Any, int] | None"]


def loads_strict_members(text: str, *, known: Known | None = None) -> tuple[Any, dict[str, str]]:
    """`loads_strict(text)`, and when it is an object, each member's value as `text` writes it (a
    request's document is known by its text, without encoding what was read again). Its top level is
    read by json's own reader of an object (`json.decoder.JSONObject`, which its stubs leave out), over
    the same scanner: the same value, errors and positions.

    `known(text, at)`: a top-level member's value whose text at `at` the caller has read strictly before
    (an object's text, which ends where its `}` does whatever follows it), as (what stands for it, where
    it ends); None to read it here."""
    start = _WHITESPACE.match(text).end()
    if text.startswith(_BOM) or not text.startswith("{", start):
        return loads_strict(text), {}
    spans: list[tuple[int, int]] = []
    members: dict[str, str] = {}
    scan = _STRICT.scan_once  # type: ignore[attr-defined]

    def value_at(s: str, at: int) -> tuple[Any, int]:
        found = known(s, at) if known is not None else None
        value, end = scan(s, at) if found is None else found
        spans.append((at, end))
        return value, end

    def top(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value = _no_dupes(pairs)
        members.update((key, text[a:b]) for (key, _), (a, b) in zip(pairs, spans, strict=True))
        return value

    value, end = JSONObject((text, start + 1), True, value_at, None, top)
    end = _WHITESPACE.match(text, end).end()
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value, members
