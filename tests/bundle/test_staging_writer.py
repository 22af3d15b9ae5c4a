"""The writer thread of a cold open: a file whose bytes span the reader's buffers is written whole,
and a write that did not reach the disk is a failure, never a short file in the cache."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from heddle.format.staging import StagingTree, StagingWriter


def test_a_file_spanning_buffers_is_written_whole_and_a_short_one_refused(tmp_path: Path) -> None:
    (tmp_path / "payload").mkdir()
    tree = StagingTree(tmp_path / "payload", what="test")
    writer = StagingWriter(tree)
    released = threading.Event()
    first, second = bytearray(b"first half;"), bytearray(b"second half")
    item = writer.file("dir/file.txt", False, len(first) + len(second))
    item.write(memoryview(first))
    writer.retire(first, lambda _buffer: released.set())
    assert released.wait(10)  # the writer has written and given back the first buffer
    item.write(memoryview(second))  # these belong to the next batch, not the one already written
    item.finish()
    short = writer.file("short.txt", True, 5)
    short.write(memoryview(b"abc"))
    short.finish()
    with pytest.raises(OSError, match=r"'short\.txt' was written with 3 of its 5 bytes"):
        writer.close()
    tree.close()
    assert (tmp_path / "payload" / "dir" / "file.txt").read_bytes() == b"first half;second half"
    assert [row.path for row in tree.rows] == ["dir/file.txt"]
    assert os.stat(tmp_path / "payload" / "dir" / "file.txt").st_mode & 0o777 == 0o444
