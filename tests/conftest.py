"""Suite-wide settings."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


# Where PYTHONDONTWRITEBYTECODE is set (some shells and sandboxes set it), nothing kept bytecode:
# every pytest process compiled every module it imports and rewrote every test module's asserts
# again (~5 s of CPU for each xdist worker), and each of the ~150 `heddle` and `heddle-server`
# processes the suite starts compiled every module of heddle changed since its bytecode was last
# written (up to ~0.25 s a process). So heddle's bytecode is brought up to date once, where Python
# keeps it by default (compileall passes over what is current), and the pytest processes keep
# their own in pytest's cache folder of the checkout (never a new __pycache__ beside the sources:
# tests list and seal folders of the checkout; never the temporary folder, which the suite leaves
# as it found it). The programs the suite starts still write none.
#
# Under a prefix Python looks for every module's bytecode there alone, the installed packages' and the
# standard library's too: in a fresh checkout each pytest process compiled the thousands of modules
# it imports again, beside the bytecode written when they were installed (some 30 s of the first
# run). So that bytecode is linked into the prefix once, before the workers start; a link Python
# finds stale it compiles and replaces (its write is a new file renamed over the link), never
# changing what it was linked from.
def _seed_bytecode(prefix: Path, roots: list[str]) -> None:
    tag = f".{sys.implementation.cache_tag}.pyc"
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in (".git", ".pytest_cache", "node_modules")]
            if os.path.basename(folder) != "__pycache__":
                continue
            target = prefix / os.path.dirname(folder).lstrip(os.sep)
            for name in files:
                if name.endswith(tag) and name.count(".") == 2:  # not opt-1/opt-2 nor pytest's rewrites
                    try:
                        target.mkdir(parents=True, exist_ok=True)
                        os.link(os.path.join(folder, name), target / name)
                    except OSError:  # there already, or another file system: compiled when imported
                        pass


if sys.dont_write_bytecode:
    _repo = Path(__file__).resolve().parents[1]
    _prefix = _repo / ".pytest_cache" / f"bytecode-{os.getuid()}"
    if "PYTEST_XDIST_WORKER" not in os.environ:
        import compileall

        compileall.compile_dir(_repo / "heddle", quiet=1)
        _seed_bytecode(_prefix, sorted({p for p in sys.path if p and os.path.isdir(p)}))
    sys.pycache_prefix = str(_prefix)
    sys.dont_write_bytecode = False

# A throwaway Postgres cluster (session scope) for the session stores and the servers sharing one.
from tests.support.postgres import TEMPLATE_ENV, postgres_dsn, remove_template, template_for_this_session  # noqa: E402, F401


def pytest_configure(config: pytest.Config) -> None:
    # Named here, in the process that starts the xdist workers, so that one initdb serves them all.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ[TEMPLATE_ENV] = str(template_for_this_session())


def pytest_unconfigure(config: pytest.Config) -> None:
    template = None if "PYTEST_XDIST_WORKER" in os.environ else os.environ.pop(TEMPLATE_ENV, None)
    if template:
        remove_template(Path(template))

# pydantic reads every installed distribution's entry points for plugins of its own when it first
# builds a model (~70 ms of CPU in each `heddle` process with the test extras installed, and the suite
# starts hundreds). heddle uses no pydantic plugin, so the processes this suite starts skip the search;
# what each command does is unchanged (scripts/bench measures start-up without this).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

# Tools run from this process (in-process runs) or from a `heddle` it starts are written as
# `#!/usr/bin/env python3`: they should find the interpreter the suite runs on first, as
# tests/support/cli.py arranges for subprocesses, not a version manager's shim (a shell and a
# dozen processes per tool call).
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


# Where heddle keeps things of its own when nothing names a folder (XDG_CACHE_HOME: the cache of
# verified payloads; XDG_CONFIG_HOME: the trust store and other settings; XDG_DATA_HOME: the default
# session store) and the temporary folder (TMPDIR: seeded data folders, workspaces, a run killed
# on purpose leaves its own behind). The names every test session points at folders of its own.
PRIVATE_HOMES = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR")


@pytest.fixture(scope="session", autouse=True)
def _private_homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Every run this suite makes, in this process or in a `heddle` or `heddle-server` it starts (they
    inherit this environment), keeps its cache, settings, sessions and temporary folders in folders
    of this test session: never the user's own, and nothing left in the temporary folder."""
    homes = {name: tmp_path_factory.mktemp(name.lower()) for name in PRIVATE_HOMES}
    before = {name: os.environ.get(name) for name in PRIVATE_HOMES}
    tempdir = tempfile.tempdir
    os.environ.update({name: str(path) for name, path in homes.items()})
    tempfile.tempdir = str(homes["TMPDIR"])  # this process's own, read once and kept
    yield homes
    tempfile.tempdir = tempdir
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# tests/model/test_conformance.py skips itself, with the reason, when the shared corpus is absent:
# a test that silently vanishes from the report looks like a test that passed.


# The tests that take longest (real servers, registries, fuzzers, a docs page's shell blocks; a
# few seconds each), longest first: a path names a whole file (its module-scoped servers stay
# shared), a node id one test. xdist hands each worker a contiguous share of the collection and
# steals from the ends of the shares; a long test left at an end starts last and the run waits
# for it. So each share starts with its part of these, dealt in turn, and the short tests fill
# the rest. Order only: a test missing from this list runs as before.
LONG_FIRST = (
    "tests/docs/test_shell_blocks.py::test_shell_blocks_run_as_written[docs/tools.md]",
    "tests/server/test_load.py",
    "tests/docs/test_shell_blocks.py::test_shell_blocks_run_as_written[examples/plugins/README.md]",
    "tests/docs/test_shell_blocks.py::test_shell_blocks_run_as_written[docs/registries.md]",
    "tests/docs/test_shell_blocks.py::test_shell_blocks_run_as_written[README.md]",
    "tests/oci/test_tag_order.py",
    "tests/server/test_fuzz.py",
    "tests/server/test_sessions_replicas.py",
    "tests/deploy/test_image.py",
    "tests/deploy/test_image_build.py",
    "tests/server/test_surfaces_e2e.py",
    "tests/sessions/test_chaos.py",
    "tests/bundle/test_mutations.py",
    "tests/server/test_slow_clients.py",
    "tests/docs/test_demo.py",
    "tests/server/test_lifecycle.py",
    "tests/server/test_bundle.py",
    "tests/oci/test_progress.py",
    "tests/bundle/test_command_programs.py",
    "tests/docs/test_shell_blocks.py::test_shell_blocks_run_as_written[examples/README.md]",
    "tests/engine/test_mcp_bounded.py",
    "tests/server/test_bounded_input.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    units: dict[str, list[pytest.Item]] = {key: [] for key in LONG_FIRST}
    rest: list[pytest.Item] = []
    for item in items:
        key = item.nodeid if item.nodeid in units else item.nodeid.split("::", 1)[0]
        units.get(key, rest).append(item)
    # Dealt back and forth (0, 1, 2, 2, 1, 0, ...), so no share gets every first pick.
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for n, key in enumerate(k for k in LONG_FIRST if units[k]):
        turn, pick = divmod(n, workers)
        heads[pick if turn % 2 == 0 else workers - 1 - pick].extend(units[key])
    # The shares as xdist's work stealing cuts them at the start: each idle worker in turn takes
    # len(pending) // workers-left.
    ordered: list[pytest.Item] = []
    left = len(items)
    for n, head in enumerate(heads):
        size = left // (workers - n)
        left -= size
        fill = max(0, size - len(head))
        ordered += head + rest[:fill]
        del rest[:fill]
    items[:] = ordered + rest
