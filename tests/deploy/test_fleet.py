"""The fleet rehearsal (scripts/fleet), in its short form, once for the module: a registry, one
PostgreSQL, three heddle-server replicas following a tag with sessions and recovery, and Debian's
HAProxy in front checking /readyz, under a mixed load through HAProxy. One test per step, each on the
rehearsal's own checks and on what it measured (counts and order, never seconds)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.postgres import fresh_schema
from tests.support.registry import RunningRegistry, registry  # noqa: F401  (the module's registry)

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# Six heddle-server starts (three at once, then one at a time), a release pulled and verified by each
# replica, and a recovery: past the suite's default on a busy machine.
# scripts/test runs this module after the rest of the suite, alone: it is a rehearsal of a fleet
# (a dozen processes under load), which the suite's workers would slow and which would slow them.
pytestmark = [pytest.mark.timeout(360), pytest.mark.rehearsal]


def _fleet() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))  # fleet.py imports load_mixed beside it
    spec = importlib.util.spec_from_file_location("heddle_fleet_rehearsal", SCRIPTS / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rehearsal(registry: RunningRegistry, postgres_dsn: str,  # noqa: F811
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    fleet = _fleet()
    if fleet.haproxy() is None:
        pytest.skip("haproxy is not installed; scripts/test installs it, or: apt-get install haproxy")
    root = tmp_path_factory.mktemp("fleet")
    os.chmod(root, 0o755)
    result = fleet.run(root, registry.address, fresh_schema(postgres_dsn), fleet.SHORT)
    yield result.as_json()
    shutil.rmtree(root, ignore_errors=True)


def _step(rehearsal: dict[str, Any], name: str) -> dict[str, Any]:
    step: dict[str, Any] = rehearsal["steps"][name]
    if step["problems"]:
        pytest.fail(json.dumps({"step": step, "failures": rehearsal["failures"], "messages": rehearsal["messages"],
                                "versions": rehearsal["versions"]}, indent=1))
    return step


def test_a_release_reaches_every_replica_and_each_conversation_keeps_its_release(rehearsal: dict[str, Any]) -> None:
    step = _step(rehearsal, "1 release")
    phase = rehearsal["phases"]["1 release"]
    assert phase["failed"] == 0 and set(phase["versions"]) == {1, 2}, phase
    assert step["conversations_across_the_swap"] >= 1
    assert all(row["serving"].count("=v2") == 3 for row in rehearsal["versions"][1:2]), rehearsal["versions"]


def test_a_rolling_restart_drains_each_replica_out_of_haproxy_and_loses_nothing(rehearsal: dict[str, Any]) -> None:
    step = _step(rehearsal, "2 rollout")
    assert step["out_by_readiness"] == ["r1", "r2", "r3"]
    phase = rehearsal["phases"]["2 rollout"]
    assert phase["failed"] == 0 and phase["requests"] > 0 and set(phase["versions"]) == {2}, phase
    whens = [row["when"] for row in rehearsal["versions"]]
    assert whens.index("r1 drained") < whens.index("r2 drained") < whens.index("r3 drained") < whens.index("rolled")


def test_a_crash_loses_only_what_was_on_the_killed_replica_and_its_session_runs_are_finished_elsewhere(
        rehearsal: dict[str, Any]) -> None:
    step = _step(rehearsal, "3 crash")
    assert step["in_flight_at_kill"] >= 1
    assert step["read_back_recovered"] >= 1 and step["read_back_unclear"] == 0
    assert rehearsal["versions"][-1]["serving"].startswith("r1=down")
    assert rehearsal["passed"]
