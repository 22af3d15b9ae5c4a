"""Mutated bundles: refused with a verification outcome, or opened to exactly what was sealed.

One small bundle (a flow, a tool, two mounts) is sealed once by a trusted key. Hypothesis
then breaks it the ways an attacker or a bad disk would: bytes flipped, inserted, deleted
or cut off in the file or in the tar inside it; header fields rewritten; tar members edited
(content, name, mode, size, type, links, added, removed, reordered) and the result left
with the old signatures, re-signed by a key nobody trusts, relabelled with the trusted
key's id, or stripped of signatures; the container re-framed. Each mutant is opened
in-process, once with a cold cache and once with the good bundle's digest already cached.

The properties, for every mutant: the outcome is a bundle error with exit code 3..8 (any
other exception is the traceback a user would see); nothing is written anywhere but the
cache; a refusal leaves no cache entry and no staging folder; a warm entry is never
touched. A mutant that does open (a byte no check covers, or a payload edit the cache
never reads) opens to a tree byte-identical to the sealed one, under the sealed digest.

CI runs a fixed, small number of examples. HEDDLE_MUTATION_EXAMPLES=N runs N per test from
a random seed instead, for a bug hunt.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import random
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import zstandard
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from heddle import canonical
from heddle.bundle.fingerprints import flow_tool_fingerprints
from heddle.bundle.plan import ToolSpec, make_plan
from heddle.errors import HeddleError
from heddle.format.cache import STAGING_PREFIX, remove_tree
from heddle.format.keys import PublicKey, SigningKey, key_id
from heddle.format.pack import pack
from heddle.format.signing import PAYLOAD_TYPE, pae
from heddle.format.tar import TarReader
from heddle.format.verify import VerifiedTree, verify_bundle
from heddle.workspace.mounts import Mount
from tests.support.cli import heddle
from tests.support.cli_inproc import heddle_inproc

from .conftest import write_agent


def seeded_key(label: str) -> SigningKey:
    # Fixed keys and deterministic Ed25519 make the sealed bundle, and so every example, repeatable.
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"heddle mutation key: {label}".encode()).digest())
    return SigningKey(key_id(key.public_key()), key)


TRUSTED = seeded_key("trusted")
UNTRUSTED = seeded_key("untrusted")
OUTCOMES = frozenset(range(3, 9))

_EXAMPLES = os.environ.get("HEDDLE_MUTATION_EXAMPLES")
MUTATION_SETTINGS = settings(
    max_examples=int(_EXAMPLES) if _EXAMPLES else 120,
    deadline=None,
    # CI sees the same examples on every run; a longer local run explores from a random seed.
    derandomize=not _EXAMPLES,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------ the sealed bundle


@dataclass(frozen=True)
class Member:
    """One tar member, with every header field a bundle must refuse free to set."""

    name: str
    data: bytes
    mode: int = 0o644
    type: str = "0"
    linkname: str = ""
    size: int | None = None  # a header may lie about its size

    def header(self) -> bytes:
        raw, prefix = self.name.encode(), b""
        if len(raw) > 100:
            cut = raw.rfind(b"/", 0, 156)
            prefix, raw = raw[:cut], raw[cut + 1 :]
        block = bytearray(512)
        block[0 : len(raw)] = raw
        block[100:108] = octal(self.mode, 8)
        block[108:124] = octal(0, 8) + octal(0, 8)
        block[124:136] = octal(len(self.data) if self.size is None else self.size, 12)
        block[136:148] = octal(0, 12)
        block[156:157] = self.type.encode()
        block[157 : 157 + len(self.linkname.encode())] = self.linkname.encode()
        block[257:265] = b"ustar\x0000"
        block[329:345] = octal(0, 8) + octal(0, 8)
        block[345 : 345 + len(prefix)] = prefix
        return bytes(with_checksum(block))


def octal(value: int, width: int) -> bytes:
    return format(value, "o").rjust(width - 1, "0").encode() + b"\0"


Tree = dict[str, tuple[int, int, bytes]]  # path -> (type bits, permission bits, content)


@dataclass(frozen=True)
class Sealed:
    blob: bytes
    tar: bytes
    members: tuple[Member, ...]
    spans: tuple[tuple[int, int], ...]  # each member's (header offset, data size) in `tar`
    manifest: bytes
    signatures: bytes
    digest: str
    tree: Tree
    trusted: PublicKey


def tree_of(root: Path) -> Tree:
    out: Tree = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            st_ = os.lstat(path)
            data = b""
            if stat.S_ISREG(st_.st_mode):
                with open(path, "rb") as fh:
                    data = fh.read()
            out[os.path.relpath(path, root)] = (stat.S_IFMT(st_.st_mode), stat.S_IMODE(st_.st_mode), data)
    return out


def read_members(tar: bytes) -> tuple[tuple[Member, ...], tuple[tuple[int, int], ...]]:
    reader = TarReader(io.BytesIO(tar), what="sealed tar")
    members, spans = [], []
    while (head := reader.next_header()) is not None:
        members.append(Member(head.name, reader.read_data(head), mode=head.mode))
        spans.append((head.offset, head.size))
    return tuple(members), tuple(spans)


def open_in(path: Path, cache: Path, trusted: PublicKey, *, prove_file: bool = False) -> VerifiedTree:
    return verify_bundle(path, trusted_keys=[trusted], cache_root=cache, tool_fingerprints=flow_tool_fingerprints,
                       prove_file=prove_file)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Sealed:
    root = tmp_path_factory.mktemp("sealed")
    out = root / "app.heddle"
    paths = write_agent(root / "agent")
    for secret in (".env", "server.pem"):  # left beside the notes to test the packer, not sealed here
        (paths["notes"] / secret).unlink(missing_ok=True)
    # Incompressible and over one zstd block (128 KiB): the head and the payload land in
    # different blocks, so damage to the payload is found while files are being staged.
    (paths["notes"] / "data.bin").write_bytes(random.Random(9).randbytes(200_000))
    fingerprints = flow_tool_fingerprints(paths["flow"])
    mounts: list[Any] = [Mount(paths["notes"], PurePosixPath("notes"), "ro"),
                         Mount(paths["work"], PurePosixPath("work"), "rw")]
    plan = make_plan(
        paths["flow"], tools_dir=paths["tools"], mounts=mounts,
        tools={name: ToolSpec(paths["tools"] / f"{name}.py", fp) for name, fp in fingerprints.items()},
    )
    result = pack(plan, out, signing_key=TRUSTED, source_date_epoch=0)
    blob = out.read_bytes()
    tar = zstandard.ZstdDecompressor().decompress(blob)
    members, spans = read_members(tar)
    trusted = PublicKey(TRUSTED.keyid, TRUSTED.key.public_key(), "trusted test key")
    opened = open_in(out, root / "cache", trusted)
    return Sealed(blob, tar, members, spans, members[0].data, members[1].data, result.digest,
                  tree_of(opened.root), trusted)


# ------------------------------------------------------------------ building mutants


@dataclass(frozen=True)
class Mutant:
    label: str
    blob: bytes
    codes: frozenset[int] = OUTCOMES
    cold_may_open: bool = True  # opening (to the sealed tree) is acceptable with a cold cache
    warm_may_open: bool = True  # ... and with the sealed digest already cached


def zstd(tar: bytes, level: int = 3, *, checksum: bool = True, content_size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_checksum=checksum, write_content_size=content_size).compress(tar)


def write_tar(members: list[Member] | tuple[Member, ...]) -> bytes:
    out = io.BytesIO()
    for m in members:
        out.write(m.header() + m.data + bytes(-len(m.data) % 512))
    out.write(bytes(1024))
    return out.getvalue()


def signatures_json(items: list[tuple[str, bytes]]) -> bytes:
    """A signatures entry holding exactly these (keyid, signature) pairs, in keyid order."""
    sigs = [{"keyid": k, "sig": base64.b64encode(s).decode()} for k, s in sorted(items)]
    return canonical.dumps({"payloadType": PAYLOAD_TYPE, "signatures": sigs})


def untrusted_sig(manifest: bytes) -> bytes:
    return UNTRUSTED.sign(pae(PAYLOAD_TYPE, manifest))


def resign(sealed: Sealed, manifest: bytes, policy: str) -> bytes:
    """The signatures entry for `manifest` under a signing policy; no policy uses the trusted key."""
    if policy == "keep":
        return sealed.signatures
    if policy == "empty":
        return signatures_json([])
    if policy == "untrusted":
        return signatures_json([(UNTRUSTED.keyid, untrusted_sig(manifest))])
    if policy == "untrusted-as-trusted":
        return signatures_json([(TRUSTED.keyid, untrusted_sig(manifest))])
    if policy == "trusted-and-untrusted":
        # The trusted signature kept whole (with the time it signed), beside an untrusted one.
        kept = json.loads(sealed.signatures)
        kept["signatures"] = sorted([*kept["signatures"], {"keyid": UNTRUSTED.keyid, "sig": base64.b64encode(
            untrusted_sig(manifest)).decode()}], key=lambda s: s["keyid"])
        return canonical.dumps(kept)
    raise AssertionError(policy)


def byte_edit(blob: bytes, kind: str, at: int, arg: int | bytes) -> bytes:
    if kind == "flip":
        assert isinstance(arg, int)
        return blob[:at] + bytes([blob[at] ^ arg]) + blob[at + 1 :]
    if kind == "insert":
        assert isinstance(arg, bytes)
        return blob[:at] + arg + blob[at:]
    if kind == "delete":
        assert isinstance(arg, int)
        return blob[:at] + blob[at + arg :]
    if kind == "truncate":
        return blob[:at]
    raise AssertionError(kind)


def draw_byte_edit(data: st.DataObject, blob: bytes, lo: int = 0, hi: int | None = None) -> tuple[str, bytes]:
    """One byte-level edit somewhere in blob[lo:hi]."""
    hi = len(blob) if hi is None else hi
    kind = data.draw(st.sampled_from(["flip", "flip", "insert", "delete", "truncate"]), label="edit")
    at = data.draw(st.integers(lo, hi - 1), label="offset")
    arg: int | bytes = 0
    if kind == "flip":
        arg = data.draw(st.integers(1, 255), label="xor")
    elif kind == "insert":
        arg = data.draw(st.binary(min_size=1, max_size=16), label="inserted")
    elif kind == "delete":
        arg = data.draw(st.integers(1, min(64, len(blob) - at)), label="deleted")
    return f"{kind} at {at} ({arg!r})", byte_edit(blob, kind, at, arg)


# Header fields as SPEC.md lays them out: (name, offset, width).
FIELDS = [
    ("name", 0, 100), ("mode", 100, 8), ("uid", 108, 8), ("gid", 116, 8), ("size", 124, 12),
    ("mtime", 136, 12), ("chksum", 148, 8), ("typeflag", 156, 1), ("linkname", 157, 100),
    ("magic", 257, 6), ("version", 263, 2), ("uname", 265, 32), ("gname", 297, 32),
    ("devmajor", 329, 8), ("devminor", 337, 8), ("prefix", 345, 155), ("pad", 500, 12),
]


def with_checksum(block: bytearray) -> bytearray:
    block[148:156] = b" " * 8
    block[148:156] = format(sum(block), "o").rjust(6, "0").encode() + b"\0 "
    return block


def field_edit(sealed: Sealed, index: int, field: str, value: bytes, fix_checksum: bool) -> bytes:
    """The sealed tar with one header field of member `index` overwritten (NUL-padded)."""
    name_, start, width = next(f for f in FIELDS if f[0] == field)
    at = sealed.spans[index][0]
    block = bytearray(sealed.tar[at : at + 512])
    block[start : start + width] = value[:width].ljust(width, b"\0")
    if fix_checksum and name_ != "chksum":
        block = with_checksum(block)
    return sealed.tar[:at] + bytes(block) + sealed.tar[at + 512 :]


NAMES = [
    "payload/flow.json", "payload/zz-extra.txt", "payload/../escape.txt", "payload/tools/../../../escape.txt",
    "../escape.txt", "/etc/escape.txt", "escape.txt", "payload//flow.json", "payload/./flow.json",
    "payload/tools/echo.py/inner", "payload/mounts", "payload/TOOLS/ECHO.PY", ".heddle/manifest.json",
    ".heddle/signatures.json", "payload/a\\b", "payload/nul\x01", "payload/" + "d/" * 40 + "f",
    "payload/mounts/notes/" + "x" * 90 + "/deep.txt",
]
LINK_TYPES = ["1", "2"]
OTHER_TYPES = ["3", "4", "5", "6", "7", "g", "x", "K", "L", "S", "V", "A", "\x7f"]


def payload_edit(sealed: Sealed, data: st.DataObject) -> tuple[str, list[Member], frozenset[int], bool]:
    """Edit the payload members; returns (label, members, codes if the manifest is kept, may open)."""
    members = list(sealed.members)
    payload = range(2, len(members))
    kind = data.draw(st.sampled_from(
        ["content", "name", "mode", "size", "type", "link", "linkname", "add", "remove", "swap", "duplicate",
         "nul-typeflag", "head"]), label="tar edit")
    i = data.draw(st.sampled_from(payload), label="member")
    m = members[i]
    if kind == "content":
        new = data.draw(st.binary(max_size=64).filter(lambda b: b != m.data), label="content")
        how = data.draw(st.sampled_from(["replace", "append", "flip"]), label="how")
        if how == "append":
            new = m.data + (new or b"\0")
        elif how == "flip" and m.data:
            at = data.draw(st.integers(0, len(m.data) - 1), label="at")
            new = m.data[:at] + bytes([m.data[at] ^ 0x20]) + m.data[at + 1 :]
        members[i] = Member(m.name, new, m.mode)
        return f"content of {m.name} {how}d", members, frozenset({6}), False
    if kind == "name":
        name = data.draw(st.sampled_from(NAMES).filter(lambda n: n != m.name), label="name")
        members[i] = Member(name, m.data, m.mode)
        return f"{m.name} renamed {name!r}", members, frozenset({7}), False
    if kind == "mode":
        mode = data.draw(st.sampled_from([0o644, 0o755, 0o777, 0o4755, 0o2755, 0o600, 0, 0o1644, 0o664])
                         .filter(lambda v: v != m.mode), label="mode")
        members[i] = Member(m.name, m.data, mode)
        return f"{m.name} mode {mode:o}", members, frozenset({6, 7}), False
    if kind == "size":
        size = data.draw(st.integers(0, 4096).filter(lambda v: v != len(m.data)), label="size")
        members[i] = Member(m.name, m.data, m.mode, size=size)
        return f"{m.name} header says {size} bytes", members, frozenset({6, 7}), False
    if kind in ("type", "link"):
        flag = data.draw(st.sampled_from(LINK_TYPES if kind == "link" else OTHER_TYPES), label="type")
        target = data.draw(st.sampled_from(["", "/etc/passwd", "../../..", "payload/flow.json"]), label="target")
        members[i] = Member(m.name, m.data, m.mode, type=flag, linkname=target)
        return f"{m.name} typeflag {flag!r} -> {target!r}", members, frozenset({7}), False
    if kind == "linkname":
        members[i] = Member(m.name, m.data, m.mode, linkname="/etc/passwd")
        return f"{m.name} names a link target", members, frozenset({7}), False
    if kind == "add":
        at = data.draw(st.integers(2, len(members)), label="at")
        name = data.draw(st.sampled_from(NAMES), label="name")
        flag = data.draw(st.sampled_from(["0", "0", "2", "5"]), label="type")
        members.insert(at, Member(name, b"added\n" if flag == "0" else b"", type=flag,
                                  linkname="/etc" if flag == "2" else ""))
        # Named like the entry expected there, it is read as that entry: a size mismatch.
        return f"{name!r} (type {flag}) added at {at}", members, frozenset({6, 7}), False
    if kind == "remove":
        del members[i]
        return f"{m.name} removed", members, frozenset({7}), False
    if kind == "swap":
        j = data.draw(st.sampled_from(payload).filter(lambda j: j != i), label="other")
        members[i], members[j] = members[j], members[i]
        return f"{m.name} swapped with {members[i].name}", members, frozenset({7}), False
    if kind == "duplicate":
        members.insert(i + 1, m)
        return f"{m.name} twice", members, frozenset({7}), False
    if kind == "nul-typeflag":
        # The old-style regular-file flag: the same archive, so it may open.
        members[i] = Member(m.name, m.data, m.mode, type="\0")
        return f"{m.name} typeflag NUL", members, OUTCOMES, True
    # The head itself: the manifest and signatures must be the first two entries.
    how = data.draw(st.sampled_from(["swap", "drop-manifest", "drop-signatures", "payload-first", "extra-first",
                                     "manifest-twice"]), label="head edit")
    if how == "swap":
        members[0], members[1] = members[1], members[0]
    elif how == "drop-manifest":
        del members[0]
    elif how == "drop-signatures":
        del members[1]
    elif how == "payload-first":
        members.insert(0, members.pop(i))
    elif how == "extra-first":
        members.insert(0, Member("payload/zz-extra.txt", b"x"))
    else:
        members.insert(1, members[0])
    return f"head: {how}", members, frozenset({7}), False


def manifest_edit(sealed: Sealed, members: list[Member], data: st.DataObject) -> tuple[str, bytes]:
    """A manifest an attacker would write: one describing the edited payload, or one field changed."""
    obj: dict[str, Any] = json.loads(sealed.manifest)
    how = data.draw(st.sampled_from(["keep", "describe", "field", "non-canonical"]), label="manifest")
    if how == "keep":
        return "manifest kept", sealed.manifest
    if how == "describe":
        described = [
            {"path": m.name.removeprefix("payload/"), "size": len(m.data), "sha256": hashlib.sha256(m.data).hexdigest(),
             "mode": m.mode}
            for m in members if m.name.startswith("payload/")
        ]
        obj["files"] = sorted(described, key=lambda f: str(f["path"]).encode())
        return "manifest rewritten to describe the payload", canonical.dumps(obj)
    if how == "non-canonical":
        return "manifest re-encoded with indentation", json.dumps(obj, indent=1).encode()
    change = data.draw(st.sampled_from(
        ["name", "version", "unknown", "flow", "sha256", "mode", "size", "path", "input", "drop", "mount", "tool"]),
        label="field")
    files: list[dict[str, Any]] = obj["files"]
    k = data.draw(st.integers(0, len(files) - 1), label="file")
    if change == "name":
        obj["name"] = "renamed"
    elif change == "version":
        obj["version"] = 2
    elif change == "unknown":
        obj["surprise"] = True
    elif change == "flow":
        obj["flow"] = files[k]["path"] if files[k]["path"] != obj["flow"] else "tools/echo.py"
    elif change == "sha256":
        files[k]["sha256"] = hashlib.sha256(b"other").hexdigest()
    elif change == "mode":
        files[k]["mode"] = 0o755 if files[k]["mode"] == 0o644 else 0o644
    elif change == "size":
        files[k]["size"] += 1
    elif change == "path":
        files[k]["path"] = "../" + files[k]["path"]
    elif change == "input":
        obj["input"] = {"text": "injected"}
    elif change == "drop":
        del obj[data.draw(st.sampled_from(sorted(obj)), label="key")]
    elif change == "mount":
        obj["mounts"][0]["mode"] = "rw" if obj["mounts"][0]["mode"] == "ro" else "ro"
    else:
        for tool in obj["tools"].values():
            tool["entry"] = obj["flow"]
    return f"manifest field {change} changed", canonical.dumps(obj)


def signatures_edit(sealed: Sealed, data: st.DataObject) -> Mutant:
    """The signatures document rewritten as JSON, over the sealed manifest and payload."""
    obj: dict[str, Any] = json.loads(sealed.signatures)
    sig: dict[str, str] = obj["signatures"][0]
    how = data.draw(st.sampled_from(
        ["nested-list", "nested-value", "duplicate-key", "extra-member", "extra-field", "keyid-upper", "sig-short",
         "sig-not-string", "same-sig-twice", "too-many", "payload-type", "not-utf8", "null", "empty",
         "reformatted", "hint-changed", "unused-bits"]), label="signatures edit")
    may_open = how in ("reformatted", "hint-changed", "unused-bits")  # none of these changes what was signed
    codes = OUTCOMES if may_open else frozenset({3} if how == "empty" else {7})
    body: bytes
    if how in ("nested-list", "nested-value"):
        depth = data.draw(st.sampled_from([2, 100, 1000, 30_000]), label="depth")
        nest = "[" * depth + "]" * depth
        if how == "nested-list":
            body = f'{{"payloadType":"{PAYLOAD_TYPE}","signatures":{nest}}}'.encode()
        else:
            body = f'{{"payloadType":{nest},"signatures":[]}}'.encode()
        how = f"{how} {depth} deep"
    elif how == "duplicate-key":
        listed = json.dumps(obj["signatures"], separators=(",", ":"))
        body = f'{{"payloadType":"{PAYLOAD_TYPE}","signatures":{listed},"signatures":{listed}}}'.encode()
    elif how == "not-utf8":
        body = sealed.signatures.replace(b'"keyid":"', b'"keyid":"\xff', 1)
    else:
        if how == "extra-member":
            obj["extra"] = 1
        elif how == "extra-field":
            sig["role"] = "root"
        elif how == "keyid-upper":
            sig["keyid"] = sig["keyid"].upper()
        elif how == "sig-short":
            sig["sig"] = base64.b64encode(base64.b64decode(sig["sig"])[:63]).decode()
        elif how == "sig-not-string":
            obj["signatures"][0] = {"keyid": sig["keyid"], "sig": 5}
        elif how == "same-sig-twice":
            obj["signatures"].append({"keyid": UNTRUSTED.keyid, "sig": sig["sig"]})
        elif how == "too-many":
            obj["signatures"] += [{"keyid": f"{n:016x}", "sig": base64.b64encode(bytes([n]) * 64).decode()}
                                  for n in range(1, 17)]
        elif how == "payload-type":
            obj["payloadType"] = "application/json"
        elif how == "null":
            obj["signatures"] = None
        elif how == "empty":
            obj["signatures"] = []
        elif how == "hint-changed":
            sig["keyid"] = UNTRUSTED.keyid  # a key id is a hint; the trusted key is tried all the same
        elif how == "unused-bits":
            # 64 bytes end in one byte of data and four spare bits; standard decoders ignore them.
            alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            text = sig["sig"]
            sig["sig"] = text[:-3] + alphabet[alphabet.index(text[-3]) ^ 1] + "=="
        body = json.dumps(obj, indent=2).encode() if how == "reformatted" else json.dumps(obj).encode()
    members = list(sealed.members)
    members[1] = Member(members[1].name, body)
    return Mutant(f"signatures: {how}", zstd(write_tar(members)), codes, may_open, may_open)


def draw_mutant(data: st.DataObject, sealed: Sealed) -> Mutant:
    family = data.draw(st.sampled_from(["file", "tar", "header", "members", "signatures", "container"]),
                       label="family")
    if family == "file":
        # The frame header, the first block (the head), anywhere, or the last block and checksum.
        region = data.draw(st.sampled_from(["frame", "start", "anywhere", "end"]), label="region")
        lo, hi = {"frame": (0, 18), "start": (0, 256), "anywhere": (0, len(sealed.blob)),
                  "end": (len(sealed.blob) - 64, len(sealed.blob))}[region]
        label, blob = draw_byte_edit(data, sealed.blob, lo, hi)
        truncated = len(blob) < len(sealed.blob) and sealed.blob.startswith(blob)
        if truncated:  # a prefix of a well-framed file can never walk to its own end
            return Mutant(f"file: {label}", blob, frozenset({7}), False, False)
        return Mutant(f"file: {label}", blob)
    if family == "tar":
        # Inside the zstd frame, so the tar and JSON readers see the damage, not the decoder.
        region = data.draw(st.sampled_from(["anywhere", "head", "payload", "end"]), label="region")
        payload_at = sealed.spans[2][0]
        lo, hi = {"anywhere": (0, len(sealed.tar)), "head": (0, payload_at),
                  "payload": (payload_at, len(sealed.tar) - 1024), "end": (len(sealed.tar) - 1024, len(sealed.tar))}[region]
        label, tar = draw_byte_edit(data, sealed.tar, lo, hi)
        cut = len(tar) < len(sealed.tar) and sealed.tar.startswith(tar)
        return Mutant(f"tar {region}: {label}", zstd(tar), OUTCOMES, not cut, True)
    if family == "header":
        index = data.draw(st.integers(0, len(sealed.members) - 1), label="member")
        name, _, width = data.draw(st.sampled_from(FIELDS), label="field")
        value = data.draw(st.one_of(
            st.binary(max_size=width),
            st.sampled_from([b"0000755", b"0001000", b"7777777", b"\x80\x00\x00\x01", b"ustar  ", b"../x", b"1", b"2"]),
        ), label="value")
        fix = data.draw(st.booleans(), label="fix checksum")
        tar = field_edit(sealed, index, name, value, fix)
        return Mutant(f"header {index}.{name} = {value!r} (checksum {'fixed' if fix else 'stale'})", zstd(tar))
    if family == "signatures":
        return signatures_edit(sealed, data)
    if family == "container":
        how = data.draw(st.sampled_from(["level", "content-size", "no-checksum", "no-content-size", "two-frames",
                                         "skippable-first", "second-frame", "junk"]), label="container")
        if how == "level":
            level = data.draw(st.integers(1, 19), label="level")
            return Mutant(f"recompressed at level {level}", zstd(sealed.tar, level))
        if how == "content-size":
            # The declared size, the one number the caps are checked against before inflating.
            descriptor = sealed.blob[4]
            single = (descriptor >> 5) & 1
            width = (single, 2, 4, 8)[descriptor >> 6]
            at = 6 - single
            old = int.from_bytes(sealed.blob[at : at + width], "little")
            new = data.draw(st.integers(0, 256**width - 1).filter(lambda v: v != old), label="content size")
            blob = sealed.blob[:at] + new.to_bytes(width, "little") + sealed.blob[at + width :]
            return Mutant(f"container: content size {old} -> {new}", blob, frozenset({7}), False, False)
        if how == "no-checksum":
            blob = zstd(sealed.tar, checksum=False)
        elif how == "no-content-size":
            blob = zstd(sealed.tar, content_size=False)
        elif how == "two-frames":
            split = data.draw(st.integers(1, len(sealed.tar) - 1), label="split")
            blob = zstd(sealed.tar[:split]) + zstd(sealed.tar[split:])
        elif how == "skippable-first":
            blob = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip" + sealed.blob
        elif how == "second-frame":
            blob = sealed.blob + zstd(b"more")
        else:
            blob = sealed.blob + data.draw(st.binary(min_size=1, max_size=8), label="junk")
        return Mutant(f"container: {how}", blob, frozenset({7}), False, False)
    label, members, payload_codes, payload_may_open = payload_edit(sealed, data)
    if label.startswith("head:"):
        return Mutant(f"members: {label}", zstd(write_tar(members)), payload_codes, False, False)
    manifest_label, manifest = manifest_edit(sealed, members, data)
    policy = data.draw(st.sampled_from(["keep", "untrusted", "untrusted-as-trusted", "trusted-and-untrusted", "empty"]),
                  label="signatures")
    members[0] = Member(members[0].name, manifest)
    members[1] = Member(members[1].name, resign(sealed, manifest, policy))
    label = f"members: {label}; {manifest_label}; signatures {policy}"
    blob = zstd(write_tar(members))
    if policy == "empty":
        return Mutant(label, blob, frozenset({3}), False, False)
    if policy == "untrusted":
        return Mutant(label, blob, frozenset({4}), False, False)
    if policy == "untrusted-as-trusted" or manifest != sealed.manifest:
        # A signature claiming the trusted key's id, or the trusted one over other bytes.
        return Mutant(label, blob, frozenset({5}), False, False)
    # The sealed manifest, still signed: only the payload differs, which a warm cache never reads.
    return Mutant(label, blob, payload_codes, payload_may_open, True)


# ------------------------------------------------------------------ checking one mutant

State = dict[str, tuple[int, int, str]]  # path -> (type and mode bits, size, sha256 of content)


def state_of(root: Path, *, leave_out: Path | None = None) -> State:
    out: State = {}
    for top, dirs, files in os.walk(root):
        if leave_out is not None:
            dirs[:] = [d for d in dirs if Path(top, d) != leave_out]
        for name in dirs + files:
            path = os.path.join(top, name)
            st_ = os.lstat(path)
            digest = ""
            if stat.S_ISREG(st_.st_mode):
                with open(path, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
            # A folder's size is its file system's bookkeeping (tmpfs counts its entries, ext4 its blocks):
            # what it holds is compared entry by entry.
            size = 0 if stat.S_ISDIR(st_.st_mode) else st_.st_size
            out[os.path.relpath(path, root)] = (st_.st_mode, size, digest)
    return out


@dataclass
class Arena:
    """A private corner of the disk: the mutants, a default TMPDIR and a working folder inside it,
    so anything the verifier writes outside the cache shows up in a before/after snapshot."""

    base: Path
    warm_cache: Path
    warm_state: State
    warm_tree: str  # the sealed tree's path in the warm cache

    @contextlib.contextmanager
    def scene(self) -> Iterator[Path]:
        work = Path(tempfile.mkdtemp(dir=self.base / "runs"))
        saved = tempfile.tempdir
        tempfile.tempdir = str(self.base / "tmp")
        try:
            with contextlib.chdir(self.base / "cwd"):
                yield work
        finally:
            tempfile.tempdir = saved
            remove_tree(work)


@pytest.fixture(scope="module")
def arena(sealed: Sealed, tmp_path_factory: pytest.TempPathFactory) -> Arena:
    base = tmp_path_factory.mktemp("arena")
    for name in ("runs", "tmp", "cwd", "good"):
        (base / name).mkdir()
    good = base / "good" / "app.heddle"
    good.write_bytes(sealed.blob)
    warm = base / "warm"
    # Twice: whatever a re-open records beside the tree is there before the first mutant.
    open_in(good, warm, sealed.trusted)
    opened = open_in(good, warm, sealed.trusted)
    assert opened.cached
    return Arena(base, warm, state_of(warm), str(opened.root.relative_to(warm)))


def loosen(state: State, tree: str) -> State:
    """The warm cache as a mutant must leave it: the sealed tree exact; what lies beside it
    (a last-used stamp, say) still there, whatever it now says."""
    return {p: v if p == tree or p.startswith(tree + os.sep) else (stat.S_IFMT(v[0]), 0, "")
            for p, v in state.items()}


def check(mutant: Mutant, sealed: Sealed, arena: Arena, *, warm: bool, prove_file: bool = False) -> None:
    """Open one mutant and check every property. `prove_file` (what `heddle verify` does) reads
    the file's own payload even when its digest is cached, so it must refuse what a cold open does."""
    may_open = mutant.warm_may_open if warm and not prove_file else mutant.cold_may_open
    with arena.scene() as work:
        cache = arena.warm_cache if warm else work / "cache"
        bundle = work / "mutant.heddle"
        bundle.write_bytes(mutant.blob)
        outside = state_of(arena.base, leave_out=cache)
        cache_before = state_of(cache) if cache.exists() else {}
        where = f"{'warm' if warm else 'cold'} cache{', proving the file' if prove_file else ''}, {mutant.label}"
        note(where)
        # Only a bundle outcome is caught: any other exception fails the example as it stands.
        opened: VerifiedTree | None = None
        try:
            opened = open_in(bundle, cache, sealed.trusted, prove_file=prove_file)
        except HeddleError as exc:
            assert exc.exit_code in mutant.codes, f"{where}: exit {exc.exit_code} ({exc}), expected {sorted(mutant.codes)}"
            assert "\n" not in exc.message, f"{where}: a multi-line error: {exc.message!r}"
        if opened is not None:
            assert may_open, f"{where}: opened, should be refused"
            assert opened.digest == sealed.digest, f"{where}: opened under another digest"
            assert tree_of(opened.root) == sealed.tree, f"{where}: opened to a tree that is not the sealed one"
        assert state_of(arena.base, leave_out=cache) == outside, f"{where}: something outside the cache changed"
        cache_after = state_of(cache) if cache.exists() else {}
        leftovers = [p for p in cache_after if p.startswith(STAGING_PREFIX)]
        assert not leftovers, f"{where}: staging left behind: {leftovers}"
        if warm:
            assert loosen(cache_after, arena.warm_tree) == loosen(arena.warm_state, arena.warm_tree), (
                f"{where}: the warm cache entry changed"
            )
        elif opened is None:
            assert cache_after == cache_before, f"{where}: a refusal left {sorted(set(cache_after) - set(cache_before))}"
        else:
            new = [p for p in cache_after if p not in cache_before and not p.startswith(sealed.digest)]
            assert not new, f"{where}: opening left {new} beside the entry"


@MUTATION_SETTINGS
@given(data=st.data())
def test_a_mutant_is_refused_or_is_the_sealed_tree(sealed: Sealed, arena: Arena, data: st.DataObject) -> None:
    check(draw_mutant(data, sealed), sealed, arena, warm=False)


@MUTATION_SETTINGS
@given(data=st.data())
def test_with_a_warm_cache_too(sealed: Sealed, arena: Arena, data: st.DataObject) -> None:
    check(draw_mutant(data, sealed), sealed, arena, warm=True)


@MUTATION_SETTINGS
@given(data=st.data())
def test_proving_the_file_with_a_warm_cache(sealed: Sealed, arena: Arena, data: st.DataObject) -> None:
    check(draw_mutant(data, sealed), sealed, arena, warm=True, prove_file=True)


# ------------------------------------------------------------------ a few through the CLI


def fixed_mutant(sealed: Sealed, name: str) -> bytes:
    members = list(sealed.members)
    tool = next(i for i, m in enumerate(members) if m.name == "payload/tools/echo.py")
    evil = members[tool].data.replace(b"json.dump(", b"__import__('os').system('id');json.dump(")
    if name == "tool-swapped":  # the sealed manifest and signature, another tool
        members[tool] = Member(members[tool].name, evil, members[tool].mode)
        return zstd(write_tar(members))
    if name == "tool-swapped-resigned":  # a manifest describing the new tool, signed by the attacker
        members[tool] = Member(members[tool].name, evil, members[tool].mode)
        obj = json.loads(sealed.manifest)
        entry = next(f for f in obj["files"] if f["path"] == "tools/echo.py")
        entry.update(size=len(evil), sha256=hashlib.sha256(evil).hexdigest())
        manifest = canonical.dumps(obj)
        members[0] = Member(members[0].name, manifest)
        members[1] = Member(members[1].name, resign(sealed, manifest, "untrusted"))
        return zstd(write_tar(members))
    if name == "relabelled":  # the attacker's signature under the trusted key's id
        members[1] = Member(members[1].name, resign(sealed, sealed.manifest, "untrusted-as-trusted"))
        return zstd(write_tar(members))
    if name == "truncated":
        return sealed.blob[: len(sealed.blob) * 2 // 3]
    raise AssertionError(name)


# `real`: through a `heddle` process, once per command; the rest through the same entry
# function in-process (tests/support/cli_inproc.py), with the same exit codes and error lines.
@pytest.mark.parametrize(
    ("command", "name", "warm", "code", "real"),
    [
        ("verify", "tool-swapped", False, 6, False),
        # `heddle verify FILE` proves FILE, even when its digest is already cached.
        ("verify", "tool-swapped", True, 6, True),
        ("verify", "relabelled", True, 5, False),
        ("run", "tool-swapped-resigned", False, 4, True),
        ("run", "truncated", True, 7, False),
    ],
)
def test_the_cli_refuses_a_mutant_in_one_line(sandbox: Path, sealed: Sealed, command: str, name: str, warm: bool,
                                              code: int, real: bool, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pub = sandbox / "trusted.pub"
    pub.write_bytes(sealed.trusted.pem())
    cache = sandbox / "cache"
    tmp = sandbox / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    if warm:
        good = sandbox / "good.heddle"
        good.write_bytes(sealed.blob)
        open_in(good, cache, sealed.trusted)  # warmed in-process: the refusal is what goes through the command
        assert state_of(cache)
    before = state_of(cache)
    bundle = sandbox / f"{name}.heddle"
    bundle.write_bytes(fixed_mutant(sealed, name))
    args: list[object] = ["verify", bundle, "--trust", pub] if command == "verify" else [
        "run", bundle, "--trust", pub, "--input", '{"text": "hi"}']
    if real:
        proc = heddle(*args, env=env)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the process's cached answer to TMPDIR
        returncode, stdout, stderr = heddle_inproc(capsys, *args)
    assert returncode == code, f"exit {returncode}\nstdout: {stdout}\nstderr: {stderr}"
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(bundle) in errors[0], stderr
    assert state_of(cache) == before, "a refusal changed the cache"
    assert os.listdir(tmp) == []
