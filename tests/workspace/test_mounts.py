"""`--mount` parsing and every start-up refusal, each asserting its message."""

from __future__ import annotations

import os
import socket
from pathlib import Path, PurePosixPath

import pytest

from heddle.errors import UsageError
from heddle.workspace.mounts import Mount, check_mounts, parse_mount


def test_parse_defaults_to_base_name_and_ro(tmp_path: Path) -> None:
    m = parse_mount(str(tmp_path / "data"))
    assert m == Mount(tmp_path / "data", PurePosixPath("data"), "ro")


def test_parse_dest_and_modes(tmp_path: Path) -> None:
    src = tmp_path / "data"
    assert parse_mount(f"{src}:in/data") == Mount(src, PurePosixPath("in/data"), "ro")
    assert parse_mount(f"{src}:rw") == Mount(src, PurePosixPath("data"), "rw")
    assert parse_mount(f"{src}:out:rw") == Mount(src, PurePosixPath("out"), "rw")
    assert parse_mount(f"{src}:out:ro") == Mount(src, PurePosixPath("out"), "ro")


def test_parse_relative_source_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_mount("data/").source == tmp_path / "data"
    assert parse_mount("data/").dest == PurePosixPath("data")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--mount '': SRC is empty"),
        (":x", "--mount ':x': SRC is empty"),
        ("/tmp/a:", "--mount '/tmp/a:': DEST is empty"),
        ("/tmp/a::rw", "--mount '/tmp/a::rw': DEST is empty"),
        ("/tmp/a:b:rx", "--mount '/tmp/a:b:rx': unknown mode 'rx'; use ro or rw"),
        ("/tmp/a:b:c:d", "--mount '/tmp/a:b:c:d': too many ':'"),
        ("/", "--mount '/': / has no base name; give a DEST"),
    ],
)
def test_parse_refusals(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_mount(spec)
    assert str(err.value).startswith(message)
    assert err.value.exit_code == 2
    assert "\n" not in str(err.value)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    return root


def refusal(mounts: list[Mount], **limits: int) -> str:
    with pytest.raises(UsageError) as err:
        check_mounts(mounts, **limits)
    assert err.value.exit_code == 2
    message = str(err.value)
    assert "\n" not in message
    return message


def test_good_mounts_pass(data: Path, tmp_path: Path) -> None:
    (tmp_path / "single.txt").write_text("s")
    check_mounts(
        [
            parse_mount(f"{data}"),
            parse_mount(f"{data}:copy/two:rw"),
            parse_mount(f"{tmp_path / 'single.txt'}:copy/one.txt"),
        ]
    )


def test_missing_source(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert refusal([parse_mount(str(missing))]) == (
        f"mount {missing}:nope:ro: {missing} does not exist; check the path"
    )


def test_dangling_symlink_source(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    assert "is a symlink to nothing; mount its target instead" in refusal([parse_mount(str(link))])


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        ("/abs", "DEST '/abs' is absolute; give a path relative to the workspace"),
        ("../up", "DEST '../up' climbs out of the workspace with '..'"),
        ("a/../../up", "DEST 'a/../../up' climbs out of the workspace with '..'"),
        (".heddle", "DEST '.heddle' is inside .heddle, which heddle reserves; choose another DEST"),
        (".heddle/bin/x", "DEST '.heddle/bin/x' is inside .heddle"),
        (".", "DEST is the workspace root; give a folder or file name inside it"),
    ],
)
def test_bad_dest(data: Path, dest: str, message: str) -> None:
    mount = Mount(data, PurePosixPath(dest), "ro")
    got = refusal([mount])
    assert got.startswith(f"mount {data}:{PurePosixPath(dest)}:ro: DEST ")
    assert message in got


def test_dest_equal_to_another(data: Path) -> None:
    message = refusal([parse_mount(f"{data}:x"), parse_mount(f"{data}:x:rw")])
    assert message == (
        f"mount {data}:x:rw: DEST 'x' is already used by mount {data}:x:ro; "
        "give one of them another DEST"
    )


@pytest.mark.parametrize("order", ["outer-first", "inner-first"])
def test_dest_nested_in_another(data: Path, order: str) -> None:
    outer, inner = parse_mount(f"{data}:x"), parse_mount(f"{data}:x/y:rw")
    mounts = [outer, inner] if order == "outer-first" else [inner, outer]
    assert refusal(mounts) == (
        f"mount {data}:x/y:rw: DEST 'x/y' is inside the DEST 'x' of mount {data}:x:ro; "
        "mounts cannot nest, give it a DEST beside the other"
    )


def test_siblings_with_common_prefix_are_not_nested(data: Path) -> None:
    check_mounts([parse_mount(f"{data}:x"), parse_mount(f"{data}:xy")])


def test_symlink_inside_source(data: Path) -> None:
    (data / "sub" / "link").symlink_to(data / "a.txt")
    assert refusal([parse_mount(str(data))]) == (
        f"mount {data}:data:ro: {data / 'sub' / 'link'} is a symlink; mounts carry only regular "
        "files and folders, remove it or mount a folder without it"
    )


def test_socket_inside_source(data: Path) -> None:
    path = data / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        assert f"{path} is a socket; mounts carry only regular files and folders" in refusal(
            [parse_mount(str(data))]
        )
    finally:
        sock.close()


def test_fifo_inside_source(data: Path) -> None:
    os.mkfifo(data / "pipe")
    assert f"{data / 'pipe'} is a named pipe;" in refusal([parse_mount(str(data))])


def test_device_source() -> None:
    assert refusal([parse_mount("/dev/null:null")]) == (
        "mount /dev/null:null:ro: /dev/null is a device; mounts carry only regular files and "
        "folders, remove it or mount a folder without it"
    )


def test_too_many_entries(data: Path) -> None:
    # data, sub, a.txt, sub/b.txt: four entries.
    check_mounts([parse_mount(str(data))], max_entries=4)
    assert refusal([parse_mount(str(data))], max_entries=3) == (
        f"mount {data}:data:ro: more than 3 files and folders; mount a smaller folder or raise "
        "--mount-max-entries"
    )


def test_too_many_bytes(data: Path) -> None:
    check_mounts([parse_mount(str(data))], max_bytes=2)
    assert refusal([parse_mount(str(data))], max_bytes=1) == (
        f"mount {data}:data:ro: more than 1 bytes; mount a smaller folder or raise "
        "--mount-max-bytes"
    )


def test_default_limits(tmp_path: Path) -> None:
    assert check_mounts.__kwdefaults__ == {"max_entries": 4096, "max_bytes": 64 * 2**20, "walk": True}
    # A sparse file: the limit counts the size a copy would have, not the disk it uses.
    with open(tmp_path / "huge.bin", "wb") as f:
        f.truncate(64 * 2**20 + 1)
    assert "more than 67108864 bytes" in refusal([parse_mount(str(tmp_path / "huge.bin"))])

