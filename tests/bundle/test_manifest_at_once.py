"""The manifest's checks made over all its files at once (what a warm open pays) decide exactly
as the field-by-field ones: the same manifests taken, the same refused, and the re-encoding
written from the checked files is canonical.dumps to the byte."""

from __future__ import annotations

import json
import random

import pytest

from heddle import canonical
from heddle.format.errors import BundleError
from heddle.format.limits import DEFAULT_LIMITS
from heddle.format.manifest import FileEntry, Manifest, _canonical, _Reader
from heddle.format.paths import parent_dirs

SHA = "ab" * 32
NAMES = ["flow.json", "a", "B.md", "ñandú.txt", "日本/語.md", "x/.hidden", "con-fig", "d/e/f.bin",
         "q" * 90 + "/" + "r" * 20, "l/" + "m" * 99 + "/n", "sp ace/t", "a-b/c", "a-b/d"]


def manifest_bytes(rng: random.Random) -> bytes:
    paths = sorted({"flow.json", *rng.sample(NAMES, rng.randint(1, len(NAMES)))}, key=lambda p: p.encode())
    files = tuple(FileEntry(p, rng.choice([0, 1, 511, 10**8]), SHA, rng.choice([0o644, 0o755])) for p in paths)
    manifest = Manifest(name="n\u00e9 \"q\"", flow="flow.json", files=files, heddle_version="0.1",
                        input={"text": "line\nbreak \\ \u2028 \x01", "n": [1, {"z": None, "a": True}]})
    return manifest.to_bytes()


def test_the_at_once_reading_and_encoding_agree_with_the_field_by_field_ones() -> None:
    rng = random.Random(4)
    for _ in range(100):
        data = manifest_bytes(rng)
        obj = json.loads(data)
        at_once = _Reader("m", DEFAULT_LIMITS, ValueError).files_at_once(obj["files"])
        assert at_once is not None and at_once == Manifest.from_json(obj).files
        assert _canonical(obj, data, at_once) and canonical.dumps(obj) == data
        # Any change the parse keeps is a change the encoding sees.
        for old, new in ((b'"size":', b'"size": '), (b'"mode":', b'"mode":0'), (b',"path"', b',"path":"x","path"'),
                         (b'flow.json', b'flow\\u002ejson'), (b'"sha256":"', b'"sha256":"\\u0061')):
            if old in data:
                mutated = data.replace(old, new, 1)
                with pytest.raises(BundleError):
                    Manifest.from_bytes(mutated)


def test_an_escaped_lone_surrogate_is_refused_not_a_crash() -> None:
    data = manifest_bytes(random.Random(1))
    for old, new in ((b'"name":"n', b'"name":"\\ud800n'), (b'"path":"flow.json"', b'"path":"flo\\udc00.json"')):
        with pytest.raises(BundleError, match=r"not canonical JSON|holds a lone surrogate"):
            Manifest.from_bytes(data.replace(old, new, 1))


def test_the_folders_of_files() -> None:
    assert parent_dirs(["a/b/c.txt", "a/d", "e", "f/g/h/i"]) == {"a", "a/b", "f", "f/g", "f/g/h"}
