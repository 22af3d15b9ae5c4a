"""The layers hold at run time: the import contract (pyproject.toml, [tool.importlinter]) counts every
import, those inside functions too, and a module of the format, the engine, the workspace, the model or the
tools reads its defaults from its own layer, never from the flag table, the glue or a shell."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

from heddle.settings import BY_NAME, CLI, SETTINGS, RunSettings
from tests.support.import_cycles import cycles

REPO = Path(__file__).resolve().parents[1]
# What the engine layer (agentspec, graph, wiring, engine, tools, model, workspace, plugin_host) and the format
# may never import: the flag table, the shells' options, the glue and the shells.
_ABOVE = ("heddle.settings", "heddle.shell_options", "heddle.runs", "heddle.core", "heddle.bundle",
          "heddle.validation", "heddle.cli", "heddle.server", "heddle.sessions")
_BELOW = ("heddle.agentspec", "heddle.graph", "heddle.wiring", "heddle.engine", "heddle.tools", "heddle.model",
          "heddle.workspace", "heddle.plugin_host", "heddle.format", "heddle.oci")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("heddle", cache_dir=None, exclude_type_checking_imports=True)


def test_the_import_contract_holds(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)  # where its cycle contract is imported from
    assert lint_imports(config_filename=os.fspath(REPO / "pyproject.toml"), no_cache=True, no_logo=True) == 0, \
        capsys.readouterr().out


def test_no_lower_layer_imports_the_flag_table_the_glue_or_a_shell(graph: grimp.ImportGraph) -> None:
    upward = sorted((a, b) for a in graph.modules if a.startswith(_BELOW)
                    for b in graph.find_modules_directly_imported_by(a) if b.startswith(_ABOVE))
    assert upward == []


def test_the_only_cycles_are_the_named_recursion(graph: grimp.ImportGraph) -> None:
    assert cycles(graph) == [["heddle.agentspec.components", "heddle.agentspec.io"],
                             ["heddle.engine.composite", "heddle.engine.nodes", "heddle.engine.run"]]


def test_the_flag_table_reads_each_layers_defaults() -> None:
    from heddle.engine.options import RunOptions
    from heddle.format.limits import ZSTD_LEVEL
    from heddle.plugin_host import MAX_NODE_ATTEMPTS, PLUGIN_TIMEOUT_S
    from heddle.settings import LEVEL
    from heddle.workspace import MOUNT_MAX_BYTES, MOUNT_MAX_ENTRIES
    from heddle.workspace.workspace import WorkspaceOptions

    settings, options, workspace = RunSettings(), RunOptions(), WorkspaceOptions()
    for name in ("max_iterations", "max_tool_rounds", "max_parallel", "timeout", "tool_timeout", "tool_output_limit",
                 "stream", "model_timeout", "model_deadline", "max_response_bytes", "max_tool_stdout_bytes",
                 "model_retries"):
        assert getattr(settings, name) == getattr(options, name), name
    assert (settings.mount_max_entries, settings.mount_max_bytes) == (MOUNT_MAX_ENTRIES, MOUNT_MAX_BYTES) == (
        workspace.max_entries, workspace.max_bytes)
    assert (settings.plugin_timeout, settings.max_node_attempts) == (PLUGIN_TIMEOUT_S, MAX_NODE_ATTEMPTS)
    assert LEVEL.default == ZSTD_LEVEL


def test_the_shells_wording_is_the_glues_and_the_engines_default_is_no_shells(graph: grimp.ImportGraph) -> None:
    """CLI and SERVER (how each shell says `--session NAME` or `"session"`) are the flag table's, which the run
    core hands down; the engine, the tools, the plugin host and the sessions default to words of no shell."""
    from heddle import surface
    from heddle.engine.options import RunOptions
    from heddle.plugin_host.process import PluginProcess
    from heddle.sessions.turn import SessionUse
    from heddle.settings import SERVER
    from heddle.tools.process import run_tool_process

    assert not hasattr(surface, "CLI") and not hasattr(surface, "SERVER")
    lower = [m for m in graph.modules if m.startswith((*_BELOW, "heddle.sessions"))]
    assert [m for m in lower if "heddle.settings" in graph.find_modules_directly_imported_by(m)] == []
    defaults = [RunOptions().surface, SessionUse.__dataclass_fields__["surface"].default,
                inspect.signature(run_tool_process).parameters["surface"].default,
                inspect.signature(PluginProcess).parameters["surface"].default]
    assert all(d is surface.NEUTRAL for d in defaults)
    for what in ("session", "approval", "resume", "input"):
        assert len({surface.NEUTRAL.say(what), CLI.say(what), SERVER.say(what)}) == 3, what
    assert (CLI.say("session"), SERVER.say("session")) == ("--session NAME",
                                                           '"session" (an id POST /v1/sessions issues)')


def test_the_glue_and_the_sessions_import_at_the_top_unless_they_say_why() -> None:
    """An import inside a function of the glue or the sessions is kept only for a reason its function states
    in a comment before it (a shell's start-up, an optional extra); every other import is at the top."""
    unexplained = []
    for path in [REPO / "heddle" / "core.py", REPO / "heddle" / "runs.py",
                 *(REPO / "heddle" / "bundle").glob("*.py"), *(REPO / "heddle" / "sessions").glob("*.py")]:
        lines = path.read_text(encoding="utf-8").splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                unexplained += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(function)
                                if isinstance(node, (ast.Import, ast.ImportFrom))
                                and not any("#" in line for line in lines[function.lineno:node.lineno])]
    assert unexplained == []


def test_a_limit_named_in_a_message_is_the_flag_that_sets_it() -> None:
    """The engine names a limit by its setting; the surface spells the flag without reading the table."""
    limits = [s for s in SETTINGS if s.flag is not None and s.kind in ("int", "duration", "size", "rounds")]
    assert limits and all(CLI.flag(s.name) == s.flag for s in limits)
    assert CLI.setting("timeout", 300) == f"{BY_NAME['timeout'].flag} 300 s"
