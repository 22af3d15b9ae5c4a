"""A read-only mount of a bundle is counted from the manifest the payload was just proved against:
the run's mount limits hold as for a folder on disk, without walking every mounted file again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import heddle
from heddle.errors import UsageError
from heddle.workspace.mounts import Mount, check_mounts
from tests.support.flows import FlowDoc


def test_a_sealed_mount_is_counted_from_its_manifest_not_walked(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = sandbox / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("a")
    (data / "sub" / "b.txt").write_text("bb")
    f = FlowDoc("mounted")
    f.control(f.start(["x"]), f.end(["x"]))
    flow = f.write(sandbox / "flow.json")
    out = sandbox / "app.heddle"
    heddle.seal(flow, output=out, mounts=[f"{data}:data"])
    with heddle.open_bundle(out, trust=heddle.TrustPolicy.allow_unsigned()) as bundle:
        [mount] = bundle.mounts
        # data, sub, a.txt, sub/b.txt: four entries, three bytes; what a walk of the folder counts.
        assert mount.sealed == (4, 3)
        walked = Mount(mount.source, mount.dest, mount.mode)

        def no_walk(*_args: object) -> None:
            raise AssertionError("a sealed mount was walked")

        for limits, refused in (({"max_entries": 4, "max_bytes": 3}, None),
                                ({"max_entries": 3}, "more than 3 files and folders"),
                                ({"max_bytes": 2}, "more than 2 bytes")):
            answers = []
            for each in (walked, mount):
                with monkeypatch.context() as patch:
                    if each is mount:
                        patch.setattr(os, "scandir", no_walk)
                    try:
                        check_mounts([each], **limits)
                        answers.append(None)
                    except UsageError as exc:
                        answers.append(str(exc))
            assert answers[0] == answers[1], answers
            assert (answers[0] is None) if refused is None else (refused in (answers[0] or "")), answers


def test_a_run_measures_its_mounts_once(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Preparing a run measures the mounts; the run that follows does not walk them again."""
    from heddle.settings import RunSettings
    from heddle.workspace import mounts
    from tests.support.inproc import run_doc

    data = sandbox / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    f = FlowDoc("mounted")
    f.control(f.start(["x"]), f.end(["x"]))
    flow = f.write(sandbox / "flow.json")
    measured: list[Path] = []
    real = mounts._measure
    monkeypatch.setattr(mounts, "_measure", lambda mount, **kw: (measured.append(mount.source), real(mount, **kw))[1])
    run_doc(flow, None, {"x": "hi"}, settings=RunSettings(mounts=(f"{data}:data",)))
    assert measured == [data]
