#!/usr/bin/env python3
"""Write the bundle test vectors and expected.json beside this script (or into --out DIR).

    .venv/bin/python bundle-format/vectors/make_vectors.py

Every vector is built here from parts (a tar writer that can also write what a bundle must
never hold) so each one differs from a valid bundle in exactly the way its name says. The
keys are derived from fixed seeds and Ed25519 signatures are deterministic, so running the
script again writes the same bytes. expected.json lists, for each case, the file, the keys
to trust, whether unsigned bundles are allowed, and the outcome a verifier must reach.

It imports nothing of heddle: canonical JSON, DSSE PAE, key ids and the outcome table are
written here from SPEC.md alone, so a bug in heddle cannot make a vector agree with it.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import io
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = Path(__file__).resolve().parent
LEVEL = 19
MTIME = 1_700_000_000
PAYLOAD_TYPE = "application/vnd.heddle.manifest+json"

# SPEC.md section 7, "Outcomes and exit codes".
OUTCOMES = {
    "ok": 0,
    "unsigned": 3,
    "untrusted_signer": 4,
    "bad_signature": 5,
    "content_mismatch": 6,
    "malformed": 7,
    "over_cap": 7,
    "unsupported_version": 8,
}

# ------------------------------------------------------------------ canonical JSON (SPEC.md section 4)

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _encode(value: Any, floats: bool) -> str:
    # bool before int: True is an int in Python.
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # Only the float-in-manifest vector and schema fingerprints (section 9) meet a float.
        if not floats or not math.isfinite(value):
            raise ValueError(f"{value!r} has no canonical spelling")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v, floats) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("object keys must be strings")
        # Python orders str by code point, which is the order the spec asks for.
        items = sorted(value.items())
        return "{" + ",".join(_string(k) + ":" + _encode(v, floats) for k, v in items) + "}"
    raise ValueError(f"{type(value).__name__} is not JSON")


def canonical(value: Any, *, floats: bool = False) -> bytes:
    return _encode(value, floats).encode("utf-8")


def fingerprint(schema: Any) -> str:
    """A tool's input-schema fingerprint (SPEC.md section 9)."""
    return "sha256:" + hashlib.sha256(canonical(schema, floats=True)).hexdigest()


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (SPEC.md section 6), joined field by field."""
    kind = payload_type.encode("utf-8")
    return b" ".join([b"DSSEv1", str(len(kind)).encode("ascii"), kind, str(len(body)).encode("ascii"), body])


# ------------------------------------------------------------------ keys


@dataclass(frozen=True)
class SigningKey:
    keyid: str
    key: Ed25519PrivateKey

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message)


def key_id(private: Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def test_key(label: str) -> SigningKey:
    seed = hashlib.sha256(f"heddle test vector key: {label}".encode()).digest()
    key = Ed25519PrivateKey.from_private_bytes(seed)
    return SigningKey(key_id(key), key)


KEYS = {name: test_key(name) for name in ("trusted", "second", "untrusted")}


def key_record(name: str) -> dict[str, str]:
    key = KEYS[name]
    public = key.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "keyid": key.keyid,
        "seed": f"sha256('heddle test vector key: {name}')",
        "public_pem": public.decode(),
    }


# ------------------------------------------------------------------ tar, written by hand


@dataclass
class Entry:
    name: str
    data: bytes = b""
    type: str = "0"
    mode: int = 0o644
    linkname: str = ""
    size: int | None = None  # a header may lie about its size


def _octal(value: int, width: int) -> bytes:
    return format(value, "o").rjust(width - 1, "0").encode() + b"\0"


def header(e: Entry) -> bytes:
    raw = e.name.encode()
    prefix = b""
    if len(raw) > 100:
        cut = raw.rfind(b"/", 0, 156)
        prefix, raw = raw[:cut], raw[cut + 1 :]
    block = bytearray(512)
    block[0 : len(raw)] = raw
    block[100:108] = _octal(e.mode, 8)
    block[108:116] = _octal(0, 8)
    block[116:124] = _octal(0, 8)
    block[124:136] = _octal(len(e.data) if e.size is None else e.size, 12)
    block[136:148] = _octal(MTIME, 12)
    block[148:156] = b" " * 8
    block[156:157] = e.type.encode()
    block[157 : 157 + len(e.linkname)] = e.linkname.encode()
    block[257:265] = b"ustar\x0000"
    block[329:337] = _octal(0, 8)
    block[337:345] = _octal(0, 8)
    block[345 : 345 + len(prefix)] = prefix
    block[148:156] = format(sum(block), "o").rjust(6, "0").encode() + b"\0 "
    return bytes(block)


def tar(entries: list[Entry], *, end: bytes = bytes(1024)) -> bytes:
    out = io.BytesIO()
    for e in entries:
        out.write(header(e))
        out.write(e.data)
        out.write(bytes(-len(e.data) % 512))
    out.write(end)
    return out.getvalue()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=LEVEL, write_checksum=True, write_content_size=True).compress(data)


# ------------------------------------------------------------------ the valid bundle, in parts

FLOW = json.dumps(
    {
        "component_type": "Flow",
        "agentspec_version": "26.1.2",
        "id": "vector-flow",
        "name": "vector",
        "inputs": [{"title": "text", "type": "string"}],
        "outputs": [{"title": "echoed", "type": "string"}],
        "start_node": {"$component_ref": "start"},
        "nodes": [{"$component_ref": "start"}, {"$component_ref": "echo-node"}, {"$component_ref": "end"}],
        "control_flow_connections": [
            {"component_type": "ControlFlowEdge", "id": "e1", "name": "start_to_echo",
             "from_node": {"$component_ref": "start"}, "to_node": {"$component_ref": "echo-node"}},
            {"component_type": "ControlFlowEdge", "id": "e2", "name": "echo_to_end",
             "from_node": {"$component_ref": "echo-node"}, "to_node": {"$component_ref": "end"}},
        ],
        "data_flow_connections": [
            {"component_type": "DataFlowEdge", "id": "d1", "name": "text_in",
             "source_node": {"$component_ref": "start"}, "source_output": "text",
             "destination_node": {"$component_ref": "echo-node"}, "destination_input": "text"},
            {"component_type": "DataFlowEdge", "id": "d2", "name": "echoed_out",
             "source_node": {"$component_ref": "echo-node"}, "source_output": "echoed",
             "destination_node": {"$component_ref": "end"}, "destination_input": "echoed"},
        ],
        "$referenced_components": {
            "start": {"component_type": "StartNode", "id": "start", "name": "start",
                      "inputs": [{"title": "text", "type": "string"}],
                      "outputs": [{"title": "text", "type": "string"}]},
            "echo-node": {"component_type": "ToolNode", "id": "echo-node", "name": "echo",
                          "inputs": [{"title": "text", "type": "string"}],
                          "outputs": [{"title": "echoed", "type": "string"}],
                          "tool": {"component_type": "ServerTool", "id": "echo-tool", "name": "echo",
                                   "inputs": [{"title": "text", "type": "string"}],
                                   "outputs": [{"title": "echoed", "type": "string"}]}},
            "end": {"component_type": "EndNode", "id": "end", "name": "end",
                    "inputs": [{"title": "echoed", "type": "string"}],
                    "outputs": [{"title": "echoed", "type": "string"}]},
        },
    },
    indent=1,
).encode()
ECHO_SCHEMA = {"type": "object", "properties": {"text": {"title": "text", "type": "string"}}, "required": ["text"]}
ECHO = b"#!/usr/bin/env python3\nimport json, sys\njson.dump({'echoed': json.load(sys.stdin)['text']}, sys.stdout)\n"
NOTES = b"# notes\nA read-only mount.\n"
WORK = b"draft\n"

Files = list[tuple[str, bytes, int]]
BASE_FILES: Files = [
    ("flow.json", FLOW, 0o644),
    ("mounts/notes/readme.md", NOTES, 0o644),
    ("mounts/work/draft.txt", WORK, 0o644),
    ("tools/echo.py", ECHO, 0o755),
]


def manifest_obj(files: Files, **overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "format": "heddle-bundle",
        "version": 1,
        "name": "vector",
        "flow": "flow.json",
        "files": [
            {"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "mode": m}
            for p, d, m in sorted(files, key=lambda f: f[0].encode())
        ],
        "tools": {"echo": {"entry": "tools/echo.py", "fingerprint": fingerprint(ECHO_SCHEMA)}},
        "plugins": [],
        "mounts": [
            {"prefix": "mounts/notes", "dest": "notes", "mode": "ro"},
            {"prefix": "mounts/work", "dest": "work", "mode": "rw"},
        ],
        "input": {"text": "hello"},
        "requires": {"bins": [], "env": [], "files": []},
        "proposals": {"max_tool_rounds": None},
        "heddle_version": "0.1.0",
    }
    obj.update(overrides)
    return obj


def signatures(manifest: bytes, *signers: str, keyids: dict[str, str] | None = None) -> bytes:
    sigs = []
    for name in signers:
        key = KEYS[name]
        sig = key.sign(pae(PAYLOAD_TYPE, manifest))
        sigs.append({"keyid": (keyids or {}).get(name, key.keyid), "sig": base64.b64encode(sig).decode()})
    return canonical({"payloadType": PAYLOAD_TYPE, "signatures": sigs})


STATEMENT_TYPE = "application/vnd.heddle.statement+json"
SIGNED_AT = "2026-01-02T03:04:05.123456Z"


def timed_signatures(manifest: bytes, signed_at: str = SIGNED_AT, *, claimed: str | None = None) -> bytes:
    """The trusted key's signature of the statement {manifest digest, signed_at} (SPEC.md section 6),
    written with `claimed` as its signed_at when given (so the file says another time than was signed)."""
    statement = canonical({"manifest": "sha256:" + hashlib.sha256(manifest).hexdigest(), "signed_at": signed_at})
    key = KEYS["trusted"]
    sig = key.sign(pae(STATEMENT_TYPE, statement))
    entry = {"keyid": key.keyid, "sig": base64.b64encode(sig).decode(), "signed_at": claimed or signed_at}
    return canonical({"payloadType": PAYLOAD_TYPE, "signatures": [entry]})


def entries(manifest: bytes, sigs: bytes, files: Files) -> list[Entry]:
    out = [Entry(".heddle/manifest.json", manifest), Entry(".heddle/signatures.json", sigs)]
    out += [Entry(f"payload/{p}", d, mode=m) for p, d, m in sorted(files, key=lambda f: f[0].encode())]
    return out


def signed(files: Files = BASE_FILES, *signers: str, **overrides: Any) -> tuple[bytes, bytes, list[Entry]]:
    manifest = canonical(manifest_obj(files, **overrides))
    sigs = signatures(manifest, *(signers or ("trusted",)))
    return manifest, sigs, entries(manifest, sigs, files)


def archive(parts: list[Entry], **kw: Any) -> bytes:
    return zstd(tar(parts, **kw))


# ------------------------------------------------------------------ the cases


@dataclass
class Case:
    name: str
    description: str
    outcome: str
    build: Callable[[], bytes]
    trust: tuple[str, ...] = ("trusted",)
    allow_unsigned: bool = False
    message: str = ""
    signers: tuple[str, ...] = ()
    file: str = ""
    legacy: bool = False


def _swap(parts: list[Entry], i: int, j: int) -> list[Entry]:
    parts = list(parts)
    parts[i], parts[j] = parts[j], parts[i]
    return parts


def _valid() -> bytes:
    return archive(signed()[2])


def _unsigned() -> bytes:
    manifest = canonical(manifest_obj(BASE_FILES))
    return archive(entries(manifest, signatures(manifest), BASE_FILES))


def _stripped() -> bytes:
    manifest = signed()[0]
    return archive(entries(manifest, signatures(manifest), BASE_FILES))


def _pax_header() -> bytes:
    parts = signed()[2]
    pax = Entry("payload/PaxHeader", b"30 path=payload/../escape.txt\n", type="x")
    return archive([*parts[:2], pax, *parts[2:]])


def _float_in_manifest() -> bytes:
    manifest = canonical(manifest_obj(BASE_FILES, input={"t": 0.5}), floats=True)
    return archive(entries(manifest, signatures(manifest, "trusted"), BASE_FILES))


def _with_paths(*extra: tuple[str, bytes, int]) -> bytes:
    files = BASE_FILES + list(extra)
    return archive(signed(files)[2])


def _member(entry: Entry, listed: bool = True) -> bytes:
    """A bundle whose manifest lists `entry.name` as a file but whose tar holds `entry` as is."""
    path = entry.name.removeprefix("payload/")
    files = BASE_FILES + ([(path, entry.data, 0o644)] if listed else [])
    parts = signed(files)[2]
    parts = [entry if p.name == entry.name else p for p in parts]
    return archive(parts)


def _symlink_chain() -> bytes:
    # The long symlink-chain escape: nested links that each resolve a level deeper than the
    # last, ending in a link to the root, then a file written through the chain.
    depth = 12
    names = ["payload/" + "/".join(["d"] * i + ["l"]) for i in range(depth)]
    files = list(BASE_FILES) + [(n.removeprefix("payload/"), b"", 0o644) for n in names[:1]]
    parts = signed(files)[2]
    links = [Entry(n, type="2", linkname="../" * (i + 1) + "l") for i, n in enumerate(names)]
    links.append(Entry("payload/" + "/".join(["l"] * depth) + "/escaped.txt", b"written through links\n"))
    head, payload = parts[:2], parts[2:]
    return archive(head + links + payload)


def _bomb() -> bytes:
    size = 256 * 1024 * 1024
    zeros = bytes(size)
    files = BASE_FILES + [("zeros.bin", zeros, 0o644)]
    parts = signed(files)[2]
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
    return compressor.compress(tar(parts))


def _legacy(entries_: list[Entry], manifest: dict[str, Any] | None = None) -> bytes:
    manifest = manifest or {"format": 1, "name": "legacy", "flow": "flow/flow.json", "tools": "tools",
                            "mounts": [{"path": "mounts/0", "dest": "notes", "mode": "ro"}],
                            "input": {"text": "hi"}, "maxToolRounds": 4}
    parts = [Entry("heddle.json", json.dumps(manifest, indent=2).encode() + b"\n")]
    parts += entries_
    return gzip.compress(tar(parts), mtime=0)


LEGACY_TREE = [
    Entry("flow/", type="5", mode=0o755),
    Entry("flow/flow.json", FLOW),
    Entry("tools/", type="5", mode=0o755),
    Entry("tools/echo.py", ECHO, mode=0o755),
    Entry("mounts/0/", type="5", mode=0o755),
    Entry("mounts/0/readme.md", NOTES),
]


def cases() -> list[Case]:
    c: list[Case] = []

    def add(name: str, description: str, outcome: str, build: Callable[[], bytes], **kw: Any) -> None:
        c.append(Case(name, description, outcome, build, **kw))

    # ---- accepted
    add("valid-signed", "a well-formed bundle signed by the trusted key", "ok", _valid, signers=("trusted",))
    add("valid-two-signers", "signed by the trusted key and an untrusted one", "ok",
        lambda: archive(signed(BASE_FILES, "trusted", "untrusted")[2]), signers=("trusted",))
    def mislabelled() -> bytes:
        manifest = canonical(manifest_obj(BASE_FILES))
        sigs = signatures(manifest, "trusted", keyids={"trusted": KEYS["untrusted"].keyid})
        return archive(entries(manifest, sigs, BASE_FILES))

    add("valid-keyid-hint-wrong", "a good signature by the trusted key labelled with another key id: ids are hints",
        "ok", mislabelled, signers=("trusted",))
    def timed(claimed: str | None = None) -> Callable[[], bytes]:
        def build() -> bytes:
            manifest = canonical(manifest_obj(BASE_FILES, release=3))
            return archive(entries(manifest, timed_signatures(manifest, claimed=claimed), BASE_FILES))

        return build

    add("valid-signed-at", "a signature of the statement {manifest digest, signed_at}, and a release number",
        "ok", timed(), signers=("trusted",))
    add("signed-at-altered", "a timed signature whose signed_at was changed after signing", "bad_signature",
        timed("2099-01-01T00:00:00.000000Z"), message=KEYS["trusted"].keyid)
    add("valid-unsigned-allowed", "an unsigned bundle opened with --allow-unsigned", "ok", _unsigned,
        allow_unsigned=True, file="unsigned.heddle")
    add("valid-long-path", "a path over 100 bytes, stored with the ustar prefix field", "ok",
        lambda: _with_paths(("mounts/notes/" + "deep/" * 20 + "file.md", b"deep\n", 0o644)), signers=("trusted",))
    add("legacy-gzip", "a format-1 gzip bundle (heddle.json) opened with --allow-unsigned", "ok",
        lambda: _legacy(LEGACY_TREE), allow_unsigned=True, legacy=True)
    # ---- trust
    add("unsigned", "an unsigned bundle without --allow-unsigned", "unsigned", _unsigned,
        file="unsigned.heddle", message="unsigned")
    add("stripped-signatures", "a signed bundle whose signature list was emptied", "unsigned",
        _stripped, message="unsigned")
    add("legacy-without-allow-unsigned", "a format-1 gzip bundle carries no signature", "unsigned",
        lambda: _legacy(LEGACY_TREE), file="legacy-gzip.heddle", message="format-1")
    add("untrusted-signer", "signed only by a key nobody trusts", "untrusted_signer",
        lambda: archive(signed(BASE_FILES, "untrusted")[2]), message=KEYS["untrusted"].keyid)
    add("signed-but-allow-unsigned", "--allow-unsigned never admits a bundle signed by an untrusted key",
        "untrusted_signer", lambda: archive(signed(BASE_FILES, "untrusted")[2]), allow_unsigned=True,
        file="untrusted-signer.heddle", message=KEYS["untrusted"].keyid)
    add("no-trusted-keys", "a signed bundle and an empty trust store", "untrusted_signer", _valid, trust=(),
        file="valid-signed.heddle", message=KEYS["trusted"].keyid)

    def flipped_manifest() -> bytes:
        manifest, _, parts = signed()
        parts[0] = Entry(parts[0].name, manifest.replace(b'"name":"vector"', b'"name":"vectos"'))
        return archive(parts)

    add("flipped-manifest-byte", "one byte of the signed manifest changed", "bad_signature", flipped_manifest,
        message=KEYS["trusted"].keyid)

    def bad_trusted_sig() -> bytes:
        manifest = canonical(manifest_obj(BASE_FILES))
        good = json.loads(signatures(manifest, "second"))
        bad = json.loads(signatures(b"something else", "trusted"))
        good["signatures"] = sorted(good["signatures"] + bad["signatures"], key=lambda s: s["keyid"])
        return archive(entries(manifest, canonical(good), BASE_FILES))

    add("bad-signature-beside-good", "a bad signature from a trusted key is fatal even beside a good one",
        "bad_signature", bad_trusted_sig, trust=("trusted", "second"), message=KEYS["trusted"].keyid)

    def duplicated_sig() -> bytes:
        manifest = canonical(manifest_obj(BASE_FILES))
        doc = json.loads(signatures(manifest, "trusted"))
        doc["signatures"] = doc["signatures"] * 2
        return archive(entries(manifest, canonical(doc), BASE_FILES))

    add("duplicated-signature", "one signature listed twice, as if two keys had signed", "malformed",
        duplicated_sig, message="twice")
    # ---- content
    def flipped_payload() -> bytes:
        parts = signed()[2]
        i = next(i for i, p in enumerate(parts) if p.name == "payload/tools/echo.py")
        data = bytearray(parts[i].data)
        data[10] ^= 0x01
        parts[i] = Entry(parts[i].name, bytes(data), mode=0o755)
        return archive(parts)

    add("flipped-payload-byte", "one byte of a payload file changed", "content_mismatch", flipped_payload,
        message="tools/echo.py")

    def size_mismatch() -> bytes:
        parts = signed()[2]
        i = next(i for i, p in enumerate(parts) if p.name == "payload/mounts/notes/readme.md")
        parts[i] = Entry(parts[i].name, NOTES + b"one more line\n")
        return archive(parts)

    add("size-mismatch", "a payload entry longer than the manifest says", "content_mismatch", size_mismatch,
        message="mounts/notes/readme.md")

    def mode_mismatch() -> bytes:
        parts = signed()[2]
        i = next(i for i, p in enumerate(parts) if p.name == "payload/mounts/work/draft.txt")
        parts[i] = Entry(parts[i].name, WORK, mode=0o755)
        return archive(parts)

    add("mode-mismatch", "a payload entry made executable after signing", "content_mismatch", mode_mismatch,
        message="draft.txt")
    add("tool-fingerprint-mismatch", "the manifest's input-schema fingerprint does not match the sealed flow",
        "content_mismatch",
        lambda: archive(signed(BASE_FILES, tools={"echo": {"entry": "tools/echo.py", "fingerprint": "sha256:" + "0" * 64}})[2]),
        message="echo")
    add("tool-not-in-flow", "the manifest seals a tool the flow never names", "content_mismatch",
        lambda: archive(signed(BASE_FILES, tools={
            "echo": {"entry": "tools/echo.py", "fingerprint": fingerprint(ECHO_SCHEMA)},
            "ghost": {"entry": "tools/echo.py", "fingerprint": fingerprint(ECHO_SCHEMA)}})[2]),
        message="ghost")
    # ---- structure
    def meta_swapped() -> bytes:
        return archive(_swap(signed()[2], 0, 1))

    add("manifest-not-first", "the signatures entry comes before the manifest", "malformed", meta_swapped,
        message="first entry")

    def payload_first() -> bytes:
        parts = signed()[2]
        return archive([parts[2], *parts[:2], *parts[3:]])

    add("payload-before-manifest", "a payload file comes first", "malformed", payload_first, message="first entry")

    def unlisted() -> bytes:
        parts = signed()[2]
        return archive(parts + [Entry("payload/zz-extra.txt", b"not in the manifest\n")])

    add("unlisted-entry", "a payload entry the manifest does not list", "malformed", unlisted, message="zz-extra.txt")

    def missing() -> bytes:
        parts = signed()[2]
        return archive([p for p in parts if p.name != "payload/tools/echo.py"])

    add("missing-entry", "a file the manifest lists is absent", "malformed", missing, message="tools/echo.py")
    add("reordered-entries", "two payload entries out of manifest order", "malformed",
        lambda: archive(_swap(signed()[2], 3, 4)), message="order")

    def duplicated() -> bytes:
        parts = signed()[2]
        return archive(parts[:4] + [parts[3]] + parts[4:])

    add("duplicated-entry", "a payload entry appears twice", "malformed", duplicated, message="twice")
    add("trailing-tar-data", "bytes after the tar's end-of-archive marker, inside the frame", "malformed",
        lambda: archive(signed()[2], end=bytes(1024) + b"hidden"), message="after the end of the tar")
    add("nonzero-padding", "data hidden in a payload entry's padding", "malformed",
        lambda: zstd(tar(signed()[2]).replace(ECHO + bytes(-len(ECHO) % 512), ECHO + b"x" + bytes(-len(ECHO) % 512 - 1))),
        message="padding")
    add("bad-entry-mode", "a payload entry with mode 0777", "malformed",
        lambda: archive([p if p.name != "payload/flow.json" else Entry(p.name, p.data, mode=0o777) for p in signed()[2]]),
        message="mode")
    add("directory-member", "a directory entry among the payload", "malformed",
        lambda: _member(Entry("payload/mounts/dir", type="5", mode=0o755)), message="directory")
    add("symlink-member", "a symbolic link where the manifest lists a file", "malformed",
        lambda: _member(Entry("payload/link", type="2", linkname="/etc/passwd")), message="symbolic link")
    add("hardlink-member", "a hard link where the manifest lists a file", "malformed",
        lambda: _member(Entry("payload/link", type="1", linkname="payload/flow.json")), message="hard link")
    add("symlink-chain", "the long symlink-chain escape pattern", "malformed", _symlink_chain,
        message="symbolic link")
    add("char-device", "a character device member", "malformed",
        lambda: _member(Entry("payload/dev", type="3")), message="character device")
    add("block-device", "a block device member", "malformed",
        lambda: _member(Entry("payload/dev", type="4")), message="block device")
    add("fifo-member", "a FIFO member", "malformed", lambda: _member(Entry("payload/fifo", type="6")), message="FIFO")
    add("pax-header", "a pax extended header that would rename the next entry", "malformed",
        _pax_header, message="pax")
    # ---- paths in the signed manifest
    add("traversal-path", "a manifest path that climbs with ..", "malformed",
        lambda: _with_paths(("mounts/../../evil.txt", b"evil\n", 0o644)), message="..")
    add("traversal-entry", "a tar entry name that climbs, not in the manifest", "malformed",
        lambda: archive(signed()[2][:2] + [Entry("payload/../../evil.txt", b"evil\n")] + signed()[2][2:]),
        message="evil.txt")
    add("absolute-path", "an absolute manifest path", "malformed",
        lambda: _with_paths(("/tmp/evil.txt", b"evil\n", 0o644)), message="absolute")
    add("backslash-path", "a backslash in a manifest path", "malformed",
        lambda: _with_paths(("mounts\\evil.txt", b"evil\n", 0o644)), message="backslash")
    add("casefold-collision", "two paths equal under case folding", "malformed",
        lambda: _with_paths(("mounts/notes/README.md", b"upper\n", 0o644)), message="case folding")
    add("unicode-collision", "two NFC paths equal under NFKC (a ligature)", "malformed",
        lambda: _with_paths(("mounts/notes/file.md", b"a\n", 0o644), ("mounts/notes/\ufb01le.md", b"b\n", 0o644)),
        message="NFKC")
    add("nfd-path", "a path not in Unicode NFC", "malformed",
        lambda: _with_paths(("mounts/notes/cafe\u0301.md", b"nfd\n", 0o644)), message="NFC")
    add("windows-reserved-name", "a Windows device name as a file name", "malformed",
        lambda: _with_paths(("mounts/notes/aux.txt", b"aux\n", 0o644)), message="reserved")
    add("control-character", "a control character in a path", "malformed",
        lambda: _with_paths(("mounts/notes/bell\x07.txt", b"x\n", 0o644)), message="control")
    add("file-and-directory", "one path both a file and a directory", "malformed",
        lambda: _with_paths(("mounts/notes", b"file\n", 0o644)), message="directory")
    add("too-deep", "a path deeper than the cap", "over_cap",
        lambda: _with_paths(("mounts/" + "d/" * 40 + "f", b"x\n", 0o644)), message="deep")
    # ---- manifest
    add("newer-format-version", "a manifest of format version 2", "unsupported_version",
        lambda: archive(signed(BASE_FILES, version=2)[2]), message="version 2")
    add("unknown-field", "a manifest with a field this version does not define", "malformed",
        lambda: archive(signed(BASE_FILES, surprise=True)[2]), message="surprise")

    def non_canonical() -> bytes:
        manifest = json.dumps(manifest_obj(BASE_FILES), indent=1).encode()
        return archive(entries(manifest, signatures(manifest, "trusted"), BASE_FILES))

    add("non-canonical-manifest", "a signed manifest that is not canonical JSON", "malformed", non_canonical,
        message="canonical")
    add("float-in-manifest", "a float in the manifest's input", "malformed",
        _float_in_manifest, message="float")
    # ---- container
    add("decompression-bomb", "256 MiB of zeros in a few kilobytes", "over_cap", _bomb, message="bomb")
    add("second-zstd-frame", "a second zstd frame after the bundle", "malformed",
        lambda: _valid() + zstd(b"more"), message="second zstd frame")
    add("trailing-junk", "bytes after the zstd frame", "malformed", lambda: _valid() + b"junk", message="trailing")
    add("truncated", "the file cut short", "malformed", lambda: _valid()[: len(_valid()) * 2 // 3], message="truncated")
    add("corrupt-checksum", "the frame's content checksum altered", "malformed",
        lambda: _valid()[:-4] + bytes(b ^ 0xFF for b in _valid()[-4:]), message="zstd")
    add("no-content-size", "a frame that does not declare its content size", "malformed",
        lambda: zstandard.ZstdCompressor(level=LEVEL, write_checksum=True, write_content_size=False).compress(tar(signed()[2])),
        message="content size")
    add("not-a-bundle", "a file that is not a bundle at all", "malformed", lambda: b"hello, world\n" * 4,
        message="not a heddle bundle")
    # ---- legacy through the same reader
    add("legacy-traversal", "a format-1 bundle with an entry that climbs", "malformed",
        lambda: _legacy(LEGACY_TREE + [Entry("../evil.txt", b"evil\n")]), allow_unsigned=True, message="..")
    add("legacy-symlink", "a format-1 bundle with a symbolic link", "malformed",
        lambda: _legacy(LEGACY_TREE + [Entry("tools/link", type="2", linkname="/etc/passwd")]),
        allow_unsigned=True, message="symbolic link")
    add("legacy-newer-format", "a format-2 gzip bundle", "unsupported_version",
        lambda: _legacy(LEGACY_TREE, {"format": 2, "name": "x", "flow": "flow/flow.json"}), allow_unsigned=True,
        message="format 2")
    return c


def write(out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    records = []
    built: dict[str, bytes] = {}
    for case in cases():
        file = case.file or f"{case.name}.heddle"
        if file not in built:
            built[file] = case.build()
            (out / file).write_bytes(built[file])
        records.append({
            "name": case.name,
            "file": file,
            "description": case.description,
            "trust": list(case.trust),
            "allow_unsigned": case.allow_unsigned,
            "expect": {
                "outcome": case.outcome,
                "exit_code": OUTCOMES[case.outcome],
                "message": case.message,
                **({"signers": [KEYS[s].keyid for s in case.signers]} if case.outcome == "ok" and not case.legacy else {}),
                **({"legacy": True} if case.legacy else {}),
            },
        })
    expected = {
        "about": "Bundle test vectors: open each file trusting the named keys; expect the outcome and exit code. "
        "Keys are Ed25519, private key = the 32-byte seed shown. 'message' is a substring of the error.",
        "keys": {name: key_record(name) for name in KEYS},
        "cases": records,
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: beside this script)")
    args = parser.parse_args()
    records = write(args.out)
    print(f"wrote {len({r['file'] for r in records})} vectors and {len(records)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
