"""heddle's own documents (`heddle init`'s starter, every flow in examples/) are valid Agent Spec for
pyagentspec 26.3.1, the specification's own reader.

pyagentspec is never a dependency: it is installed into a scratch virtualenv once per checkout
(under pytest's cache folder, .pytest_cache/heddle-tests, keyed by its version and the
interpreter's; never the user's own cache) and run there as a subprocess. Where it cannot be
installed (no package index), the test skips and says why.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from heddle.starter import FLOW

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VERSION = "26.3.1"
# A flow whose node type comes from a plugin is Agent Spec only to a reader that has the plugin.
PLUGIN_TYPED = {"plugins/custom-node/flow.yaml": "its TextStats node is a plugin's node type"}

# Run in the scratch virtualenv: every problem pyagentspec finds in each document, as JSON. Its
# partial loader gives the messages (its strict loader cannot format some of them with the
# pydantic it installs); the strict loader gives the verdict.
CHECK = r"""
import json, sys, yaml
from pyagentspec.serialization import AgentSpecDeserializer
out = {}
for path in sys.argv[1:]:
    data = yaml.safe_load(open(path, encoding="utf-8"))
    problems = []
    try:
        _, errors = AgentSpecDeserializer().from_partial_dict(data)
        problems = sorted({f"{'.'.join(map(str, e.loc))}: {e.msg}" for e in errors})
        if not problems:
            AgentSpecDeserializer().from_dict(data)
    except Exception as exc:
        problems = problems or [f"{type(exc).__name__}: {exc}"]
    out[path] = problems
print(json.dumps(out))
"""


def _cache_root() -> Path:
    return REPO / ".pytest_cache" / "heddle-tests"


def _pyagentspec_python(version: str = VERSION) -> Path:
    """The scratch virtualenv's python with pyagentspec `version` installed: made once, then reused;
    skips the test with pip's own words when the package cannot be installed."""
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / f"pyagentspec-{version}-py{sys.version_info.major}.{sys.version_info.minor}"
    python = venv / "bin" / "python"
    done = venv / ".installed"
    # Two test workers may get here at once: one installs, the other waits for it.
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file() and python.is_file():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        # Built aside and renamed into place: an interrupted install never looks finished.
        staging = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=root))
        try:
            subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True, capture_output=True)
            pip = subprocess.run(
                [str(staging / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "--retries", "0", "--timeout", "15", f"pyagentspec=={version}"],
                check=False, capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            shutil.rmtree(staging, ignore_errors=True)
            pytest.skip(f"pyagentspec {version} could not be installed: pip found no index within 100 s")
        if pip.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            said = [line for line in pip.stderr.splitlines() if line.strip() and "WARNING: Location" not in line]
            pytest.skip(f"pyagentspec {version} could not be installed: {said[-1] if said else 'pip failed'}")
        # The venv's scripts name the folder it was made in; only its python is used (`python -m`,
        # `python -c`), which finds its packages relative to itself wherever the folder is.
        staging.rename(venv)
        done.write_text(version, encoding="utf-8")
    return python


def _documents(tmp_path: Path) -> dict[str, Path]:
    starter = tmp_path / "starter.yaml"
    starter.write_text(FLOW % {"port": 4321}, encoding="utf-8")
    docs = {"heddle init's starter": starter}
    for flow in sorted(EXAMPLES.rglob("flow.yaml")):
        name = flow.relative_to(EXAMPLES).as_posix()
        if name not in PLUGIN_TYPED:
            docs[f"examples/{name}"] = flow
    return docs


@pytest.fixture(scope="module")
def pyagentspec_found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """What pyagentspec finds in the starter and in every flow of examples/ (the plugin-typed one too),
    by path: one start of its interpreter for the tests below that read it."""
    python = _pyagentspec_python()
    paths = {*map(str, _documents(tmp_path_factory.mktemp("starter")).values()),
             *map(str, EXAMPLES.rglob("flow.yaml"))}
    proc = subprocess.run([str(python), "-c", CHECK, *sorted(paths)], check=False, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    found: dict[str, list[str]] = json.loads(proc.stdout)
    return found


def test_the_starter_and_every_example_are_valid_agent_spec(pyagentspec_found: dict[str, list[str]]) -> None:
    assert set(PLUGIN_TYPED) <= {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("flow.yaml")}
    starter = next(Path(path) for path in pyagentspec_found if Path(path).name == "starter.yaml")
    docs = _documents(starter.parent)
    found = pyagentspec_found
    problems = {name: found[str(path)] for name, path in docs.items() if found[str(path)]}
    assert problems == {}, json.dumps(problems, indent=2)
    assert len(docs) >= 6  # the starter, the three examples and the plugin examples but one


def test_the_version_table_is_pyagentspec_s() -> None:
    # heddle/agentspec/agentspec_versions.json (the first version of each type and field, which heddle
    # refuses a document for predating, as pyagentspec does) is what the installed release prints.
    python = _pyagentspec_python()
    script = REPO / "scripts" / "agentspec_versions.py"
    proc = subprocess.run([str(python), str(script)], check=False, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    table = json.loads((REPO / "heddle" / "agentspec" / "agentspec_versions.json").read_text(encoding="utf-8"))
    assert table["pyagentspec"] == VERSION
    assert json.loads(proc.stdout) == table


def test_heddle_validate_agrees_with_pyagentspec_on_every_example(pyagentspec_found: dict[str, list[str]]) -> None:
    # Valid for `heddle validate` (with the example's tools folder) exactly where pyagentspec 26.3.1
    # loads it; the plugin-typed example is refused by both (neither has its plugin here).
    from tests.support.inproc import check_doc

    flows = sorted(EXAMPLES.rglob("flow.yaml"))
    found = pyagentspec_found
    verdicts = {}
    for flow in flows:
        tools = flow.parent / "tools"
        code, line = check_doc(flow, tools if tools.is_dir() else None)
        verdicts[flow.relative_to(EXAMPLES).as_posix()] = (not found[str(flow)], code == 0, line)
    disagree = {name: v for name, v in verdicts.items() if v[0] != v[1]}
    assert disagree == {}, json.dumps(disagree, indent=2)
    assert not verdicts["plugins/custom-node/flow.yaml"][0]
