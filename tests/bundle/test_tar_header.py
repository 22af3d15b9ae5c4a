"""Tar headers: a number wider than its 11 octal digits is refused, never written shifted; a header
written exactly as the one due is read without a parse, any other is parsed and checked."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from heddle.errors import UsageError
from heddle.format import tar
from heddle.format.errors import MalformedBundleError
from heddle.format.pack import resolve_source_date_epoch
from heddle.format.tar import BLOCK, END_OF_ARCHIVE, MAX_SIZE, TarReader, header, padding, parse_header


def test_the_widest_numbers_fit_and_one_more_is_refused() -> None:
    assert len(header("a", MAX_SIZE, 0o644, MAX_SIZE)) == BLOCK
    with pytest.raises(ValueError, match="does not fit a ustar header"):
        header("a", MAX_SIZE + 1, 0o644, 0)
    with pytest.raises(ValueError, match="does not fit a ustar header"):
        header("a", 1, 0o644, MAX_SIZE + 1)


def test_a_source_date_epoch_past_the_header_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(MAX_SIZE))
    assert resolve_source_date_epoch() == MAX_SIZE
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(MAX_SIZE + 1))
    with pytest.raises(UsageError, match=r"SOURCE_DATE_EPOCH='8589934592' is past what a tar header holds"):
        resolve_source_date_epoch()


def _stream(block: bytes, data: bytes) -> io.BytesIO:
    return io.BytesIO(block + data + bytes(padding(len(data))) + END_OF_ARCHIVE)


def test_a_header_as_a_packer_writes_it_is_taken_without_a_parse_and_reads_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_name = "payload/" + "d/" * 40 + "long-name.txt"  # over 100 bytes: split into prefix and name
    for name, mode in (("payload/a.txt", 0o644), (long_name, 0o755)):
        block = header(name, 5, mode, 1234)
        parsed = parse_header(block, 0)
        monkeypatch.setattr(tar, "parse_header", _no_parse)
        reader = TarReader(_stream(block, b"hello"), what="t")
        assert reader.next_header((name, 5, mode, 1234)) == parsed
        assert reader.read_data(parsed) == b"hello" and reader.next_header() is None
        monkeypatch.undo()


def _no_parse(block: bytes, offset: int, *, strict: bool = True) -> tar.TarHeader:
    raise AssertionError("parsed")


def test_a_header_other_than_due_is_parsed_and_checked() -> None:
    other = header("payload/a.txt", 5, 0o644, 99)  # valid, but not the mtime the archive's head has
    entry = TarReader(_stream(other, b"hello"), what="t").next_header(("payload/a.txt", 5, 0o644, 1234))
    assert entry is not None and entry.mtime == 99
    corrupt = bytearray(header("payload/a.txt", 5, 0o644, 1234))
    corrupt[0] ^= 1
    with pytest.raises(MalformedBundleError, match="checksum mismatch"):
        TarReader(_stream(bytes(corrupt), b"hello"), what="t").next_header(("payload/a.txt", 5, 0o644, 1234))


def test_verifying_a_packed_bundle_parses_no_payload_header(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every payload header of a packed bundle is exactly the one due: only the manifest's and the
    signatures' headers are parsed (a payload parse per file was a tenth of a cold open's CPU)."""
    from heddle.format.pack import pack
    from heddle.format.verify import verify_bundle

    from .conftest import agent_plan, write_agent

    plan = agent_plan(write_agent(sandbox / "agent"))
    pack(plan, sandbox / "app.heddle")
    parsed: list[str] = []
    real = tar.parse_header

    def counting(block: bytes, offset: int, *, strict: bool = True) -> tar.TarHeader:
        entry = real(block, offset, strict=strict)
        parsed.append(entry.name)
        return entry

    monkeypatch.setattr(tar, "parse_header", counting)
    opened = verify_bundle(sandbox / "app.heddle", trusted_keys=[], allow_unsigned=True, prove_file=True)
    assert not opened.cached and len(opened.manifest.files) > 3
    assert parsed == [".heddle/manifest.json", ".heddle/signatures.json"]
