"""The tests write nothing into the user's own cache, config or data folders and leave nothing in the
temporary folder: scripts/test points everything it runs at a throwaway folder it removes (private_homes in
scripts/_env.sh), and tests/conftest.py does the same for every pytest session, however it is started."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from heddle import seal
from tests.support.cli import BIN
from tests.support.flows import FlowDoc

REPO = Path(__file__).resolve().parents[1]


def test_this_session_keeps_heddles_folders_to_itself(tmp_path_factory: pytest.TempPathFactory) -> None:
    from heddle.format.cache import default_cache_root
    from heddle.format.trust import default_trust_dir
    from heddle.sessions.files import default_session_dir
    from heddle.sessions.sqlite import default_session_db

    base = tmp_path_factory.getbasetemp()
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR"):
        assert base in Path(os.environ[name]).parents, name
    assert base in Path(tempfile.gettempdir()).parents
    for path in (default_cache_root(), default_trust_dir(), default_session_db(), default_session_dir()):
        assert base in path.parents, path


def test_private_homes_leaves_nothing_behind(tmp_path: Path) -> None:
    """What scripts/test does before anything else, then a real `heddle` that fills the cache, makes a
    data folder and keeps a session: nothing reaches HOME, and the temporary folder is as it was."""
    home, tmp, work = tmp_path / "home", tmp_path / "tmp", tmp_path / "work"
    for folder in (home, tmp, work):
        folder.mkdir()
    tmp.chmod(0o1777)
    f = FlowDoc("tidy")
    start, end = f.start(["text"]), f.end(["text"])
    f.control(start, end)
    bundle = seal(f.write(work / "flow.json"), input={"text": "hi"}, output=work / "app.heddle").path
    script = ('source scripts/_env.sh\nprivate_homes\necho "$SCRATCH"\n'
              f'"{BIN}/heddle" run {bundle} --allow-unsigned --session s >/dev/null\n'
              'ls "$XDG_CACHE_HOME/heddle/bundles" "$XDG_DATA_HOME/heddle" >/dev/null\n')
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "TMPDIR": str(tmp)}
    proc = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    scratch = Path(proc.stdout.strip())
    assert scratch.parent == tmp and not scratch.exists()
    assert list(home.iterdir()) == [] and list(tmp.iterdir()) == []
