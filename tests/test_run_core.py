"""The run core (heddle/core.py): the one caller of the engine's preparation and run and of a session's turn,
and the same settled settings whichever shell opens a bundle; a server surface runs a request through it as
POST /v1/runs does (Service.submit)."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

import heddle
from heddle.engine.events import Event
from heddle.server.errors import ApiError
from tests.server.flows import ECHO, one_tool_flow
from tests.support.flows import write_script

HEDDLE = Path(__file__).resolve().parents[1] / "heddle"
ACTS = ("prepare_run", "run_prepared", "run_turn")


def _calls() -> dict[str, list[str]]:
    """Where in heddle/ each of ACTS is called, by module path and line."""
    found: dict[str, list[str]] = {name: [] for name in ACTS}
    for path in sorted(HEDDLE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(act in text for act in ACTS):
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            # Handed to a worker (run_blocking(..., prepare_run, ...)) counts as a call too.
            named = [name, *(a.id for a in node.args if isinstance(a, ast.Name))]
            for act in ACTS:
                if act in named:
                    found[act].append(f"{path.relative_to(HEDDLE.parent)}:{node.lineno}")
    return found


def test_the_engine_is_prepared_and_run_and_a_turn_taken_in_one_place() -> None:
    calls = _calls()
    assert {act: [where.split(":")[0] for where in sites] for act, sites in calls.items()} == {
        act: ["heddle/core.py"] for act in ACTS}, calls


@pytest.fixture
def private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, var in (("trust", "HEDDLE_TRUST_DIR"), ("cache", "HEDDLE_CACHE_DIR"), ("home", "HOME")):
        (tmp_path / name).mkdir(mode=0o700)
        monkeypatch.setenv(var, str(tmp_path / name))
    return tmp_path


def _bundle(root: Path, **proposals: object) -> heddle.Bundle:
    tools = root / "tools"
    write_script(tools, "echo", ECHO)
    flow = one_tool_flow("echoer", "echo").write(root / "flow.json")
    sealed = heddle.seal(flow, tools_dir=tools, input={"x": 1}, output=root / "app.heddle", **proposals)  # type: ignore[arg-type]
    return heddle.open_bundle(sealed.path, trust=heddle.TrustPolicy.allow_unsigned())


def _server(bundle: heddle.Bundle, settings: heddle.RunSettings, given: frozenset[str]):
    from heddle.server.config import ServerConfig
    from heddle.server.service import Service

    return Service(ServerConfig(bundle=str(bundle.path), allow_unsigned=True, settings=settings, given=given),
                   sealed=bundle)


@pytest.mark.parametrize("flags", [{}, {"max_tool_rounds": 7}])
def test_the_cli_and_the_server_settle_a_bundles_two_proposals_alike(private: Path, flags: dict[str, int]) -> None:
    from heddle.runs import from_bundle

    bundle = _bundle(private, max_tool_rounds=3, safe=True)
    assert bundle.manifest.proposals.max_tool_rounds == 3 and bundle.manifest.proposals.safe
    settings, given = heddle.RunSettings(**flags), frozenset(flags)  # type: ignore[arg-type]
    cli = from_bundle(bundle, settings, given=given).core.settings
    service = _server(bundle, settings, given)
    try:
        server = service.core.settings
        # The proposals each yield to a flag given, and fill in the rest: the same on both shells.
        assert (cli.max_tool_rounds, cli.safe) == (server.max_tool_rounds, server.safe) \
            == (flags.get("max_tool_rounds", 3), True)
        caps = service.capabilities()
        assert caps["limits"]["maxToolRounds"] == server.max_tool_rounds and caps["sandbox"]["safe"] is True
    finally:
        asyncio.run(service.aclose())
        bundle.close()


def test_a_surface_runs_a_request_as_post_v1_runs_does(private: Path) -> None:
    bundle = _bundle(private)
    service = _server(bundle, heddle.RunSettings(), frozenset())

    async def main() -> None:
        events: list[Event] = []
        run = await service.submit({"inputs": {"x": 5}}, events.append)
        try:
            assert service.admission.active == 1
            outcome = await run.outcome()
        finally:
            await run.aclose()
        assert run.answer(outcome) == {"flow": "echoer", "state": outcome.state, "outputs": {"x": 5}}
        assert events[0].type == "flow_start" and events[-1].type == "flow_complete"
        assert service.admission.active == 0
        # What POST /v1/runs refuses is refused the same way, before anything runs.
        with pytest.raises(ApiError) as refused:
            await service.submit({"flow": {}}, events.append)
        assert refused.value.type == "bundle_only" and service.admission.active == 0
        await service.aclose()

    try:
        asyncio.run(main())
    finally:
        bundle.close()


def test_each_act_has_one_name_and_an_opened_bundle_one_shape(private: Path) -> None:
    defined: dict[str, list[str]] = {}
    for path in sorted(HEDDLE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for name in re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.MULTILINE):
            defined.setdefault(name, []).append(str(path.relative_to(HEDDLE.parent)))
    # The library opens (and verifies) a bundle; the format verifies one: two names, not one for both.
    assert defined["open_bundle"] == ["heddle/bundle/verified.py"]
    assert defined["verify_bundle"] == ["heddle/format/verify.py"]
    assert not {"SealedRun", "OpenedBundle", "Loaded", "open_runnable"} & set(defined)
    bundle = _bundle(private, max_tool_rounds=2)
    with bundle:
        # What runs is read from the Bundle itself: the library, both shells and the core take this one shape.
        assert bundle.digest.startswith("sha256:") and bundle.flow.name == "echoer" and set(bundle.tools) == {"echo"}
        assert dict(bundle.input) == {"x": 1} and bundle.manifest.proposals.max_tool_rounds == 2


def test_sealing_takes_one_settings_object(private: Path) -> None:
    import dataclasses
    import inspect

    from heddle.bundle.seal import seal
    from heddle.cli.seal import seal_flow

    # Every sealing option is a field of SealSettings, with its default; no signature spells them again.
    assert list(inspect.signature(seal).parameters) == ["flow", "settings", "given"]
    assert [p for p in inspect.signature(seal_flow).parameters if p in
            {f.name for f in dataclasses.fields(heddle.SealSettings)}] == []
    tools = private / "tools"
    write_script(tools, "echo", ECHO)
    flow = one_tool_flow("echoer", "echo").write(private / "flow.json")
    settings = heddle.SealSettings(tools_dir=tools, output=private / "a.heddle", max_tool_rounds=4)
    sealed = heddle.seal(flow, settings, output=private / "b.heddle")  # a field given replaces the settings'
    assert sealed.path == private / "b.heddle" and sealed.manifest.proposals.max_tool_rounds == 4
    with pytest.raises(heddle.UsageError, match="'tool_dir' is not a sealing setting"):
        heddle.seal(flow, tool_dir=tools)


def test_the_servers_core_objects_are_typed() -> None:
    import inspect

    from heddle.server.edition import Edition, build_edition
    from heddle.server.service import Job, Service, Submitted

    shown = {f"Edition.{name}": kind for name, kind in Edition.__annotations__.items()}
    shown |= {f"{cls.__name__}.{name}": inspect.signature(member.fget).return_annotation
              for cls in (Service, Job, Submitted)
              for name, member in vars(cls).items() if isinstance(member, property)}
    for function in (Service.__init__, Service.encoder, Service.start, Service.submit, build_edition):
        shown |= {f"{function.__qualname__}({name})": p.annotation
                  for name, p in inspect.signature(function).parameters.items() if name != "self"}
        shown[f"{function.__qualname__} ->"] = inspect.signature(function).return_annotation
    assert not {where: kind for where, kind in shown.items() if kind in ("Any", "Any = None") or "Any |" in kind}
