"""Credentials from the environment go to the registry `HEDDLE_REGISTRY` names, and to no other:
two real registries that would both take them, and only the named one is given them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from heddle import oci, seal
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc
from tests.support.registry import RunningRegistry, running_registry


@pytest.fixture(scope="module")
def other_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A second registry asking for basic auth, with the same user and password as `auth_registry`."""
    with running_registry(tmp_path_factory.mktemp("other-registry"), auth=True) as running:
        yield running


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("cache", "home"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no docker config
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    f = FlowDoc("bound")
    start = f.start(["x"])
    end = f.end(["x"])
    f.control(start, end)
    return seal(f.write(tmp_path / "flow.json"), output=tmp_path / "bound.heddle").path


def test_environment_credentials_go_to_their_registry_alone(auth_registry: RunningRegistry,
                                                            other_registry: RunningRegistry, bundle: Path,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert (auth_registry.username, auth_registry.password) == (other_registry.username, other_registry.password)
    monkeypatch.setenv("HEDDLE_REGISTRY_USERNAME", str(auth_registry.username))
    monkeypatch.setenv("HEDDLE_REGISTRY_PASSWORD", str(auth_registry.password))
    first, other = auth_registry.ref("agents/bound:v1"), other_registry.ref("agents/bound:v1")
    # Named nowhere: sent nowhere, and the refusal says what to set.
    monkeypatch.delenv("HEDDLE_REGISTRY", raising=False)
    proc = heddle("push", bundle, first)
    assert proc.returncode == 2 and f"HEDDLE_REGISTRY={auth_registry.address}" in error_line(proc)
    assert str(auth_registry.password) not in proc.stderr
    # Named: the first registry takes them; the second, which would take them too, is never given them.
    monkeypatch.setenv("HEDDLE_REGISTRY", auth_registry.address)
    pushed = oci.push(bundle, first)
    proc = heddle_here(capsys, "push", bundle, other)
    assert proc.returncode == 2 and "asks for credentials and none were found" in error_line(proc)
    # The other way round.
    monkeypatch.setenv("HEDDLE_REGISTRY", other_registry.address)
    assert heddle_here(capsys, "push", bundle, other).returncode == 0
    proc = heddle_here(capsys, "pull", first, "-o", tmp_path / "pulled.heddle")
    assert proc.returncode == 2 and "asks for credentials and none were found" in error_line(proc)
    assert oci.resolve(other).oci_digest == pushed.oci_digest
