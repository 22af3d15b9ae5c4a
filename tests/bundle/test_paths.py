"""The path rules, one refusal at a time."""

from __future__ import annotations

import pytest

from heddle.format.paths import PathSet, path_problem


@pytest.mark.parametrize("path", [
    "flow.yaml", "tools/echo.py", "mounts/skills/a b/ñandú.md", "x/.hidden", "日本/語.txt", "con-fig.txt", "a.b.c",
])
def test_allowed(path: str) -> None:
    assert path_problem(path, max_depth=32) is None


@pytest.mark.parametrize("path, problem", [
    ("", "empty"),
    ("/etc/passwd", "absolute"),
    ("a/../b", "'..'"),
    ("./a", "'.'"),
    ("a//b", "empty component"),
    ("a/", "empty component"),
    ("a\\b", "backslash"),
    ("a\x00b", "NUL"),
    ("a\x1bb", "U+001B"),
    ("a\x85b", "U+0085"),
    ("cafe\u0301", "NFC"),
    ("a:b", "':'"),
    ("what?", "'?'"),
    ("trailing.", "space or dot"),
    ("trailing ", "space or dot"),
    ("NUL", "reserved"),
    ("x/Com1.txt", "reserved"),
    ("lpt\u00b9", "reserved"),
    ("x/aux .log", "reserved"),
    ("a" * 256, "255 bytes"),
    ("/".join(["d"] * 40), "levels deep"),
])
def test_refused(path: str, problem: str) -> None:
    found = path_problem(path, max_depth=32)
    assert found is not None and problem in found


def test_collisions() -> None:
    seen = PathSet()
    assert seen.add_file("Docs/Readme.md") is None
    assert "case folding" in seen.add_file("docs/README.md")
    assert "needs it to be a directory" in seen.add_file("DOCS")
    assert "needs it to be a directory" in seen.add_file("docs/Readme.md/inner")
    assert "appears twice" in seen.add_file("Docs/Readme.md")
    assert seen.add_file("\ufb01le") is None
    assert "NFKC" in seen.add_file("file")
    assert "NFKC" in seen.add_file("ＦＩＬＥ")
    assert seen.add_file("stra\u00dfe") is None
    assert "case folding" in seen.add_file("STRASSE")


def test_checking_all_paths_at_once_is_never_laxer_than_one_by_one() -> None:
    """`all_clean` and `collision_free` are fast paths; whenever they pass, the per-path
    rules must pass too."""
    import random

    from heddle.format.paths import all_clean, collision_free

    pool = [
        "a", "B", "docs", "x.md", ".hidden", "..", ".", "", " ", "a ", "a.", "con", "Con.txt", "aux .log",
        "LPT\u00b9", "conın$", "CONIN$", "ﬁle", "file", "FILE", "straße", "STRASSE", "cafe\u0301", "café",
        "a:b", "q?", "t\x07", "t\x85", "new\nline", "back\\slash", "ＦＩＬＥ", "K", "\u212a", "k", "x" * 70, "y" * 64,
        "ñ" * 40, "日本", "a" * 300,
        "COM1", "com0", "Lpt9.log", "lpt10", "conout$ ", "CONOUT$.x", "con  .txt", "cons", "icon", "nul.tar.gz",
        "prn x", "auxiliary", "a" * 255, "b" * 256, "ab\x7f", "/", "..", "a\\", "v<1>",
    ]
    rng = random.Random(1)
    for _ in range(4000):
        paths = ["/".join(rng.choice(pool) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.1:
            paths.append("/" + paths[0])
        if rng.random() < 0.05:
            paths.append("/".join(["d"] * rng.randint(30, 34)))
        if all_clean(paths, max_depth=32):
            assert all(path_problem(p, max_depth=32) is None for p in paths), paths
        clean = [p for p in paths if path_problem(p, max_depth=32) is None]
        if collision_free(clean):
            seen = PathSet()
            assert all(seen.add_file(p) is None for p in clean), clean
