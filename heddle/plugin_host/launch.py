"""How a plugin's `command` becomes the argv, environment and folder of its process.

The program is always run by its absolute path inside the plugin folder. A command that
starts with `python` or `python3` runs on the interpreter heddle itself runs on, so a
plugin written with `heddle.plugin` imports it without installing anything. The process
runs in its home folder (`HEDDLE_PLUGIN_HOME`, the one place it may write); under `--safe`
it is confined like a tool: the system and the plugin folder read-only, the home writable,
nothing else.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.manifest import PluginManifest
from heddle.secret_env import without_secrets
from heddle.workspace.sandbox import confine

if TYPE_CHECKING:
    from heddle.workspace.egress_proxy import EgressCall
    from heddle.workspace.sandbox import SandboxPolicy

PYTHON_COMMANDS = ("python", "python3")
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/lib", "/opt/")


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    cwd: Path


@dataclass(frozen=True)
class _Home:
    """The shape of a workspace the sandbox needs: a writable root with nothing read-only in it."""

    root: Path

    def ro_binds(self) -> tuple[Path, ...]:
        return ()


def _heddle_source_root() -> Path:
    return Path(os.path.realpath(Path(__file__).parents[2]))


def _python(confined: bool) -> tuple[str, tuple[Path, ...]]:
    """The interpreter for Python plugins, and what a sandbox must let it read."""
    if not confined:
        return sys.executable, ()
    # In a sandbox a virtualenv's launcher is not there; its base interpreter and stdlib are.
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    readable = () if exe.startswith(_SYSTEM_PREFIXES) else (Path(os.path.realpath(sys.base_prefix)),)
    return exe, readable


def _argv(manifest: PluginManifest, confined: bool) -> tuple[list[str], tuple[Path, ...], bool]:
    command = list(manifest.command)
    first = command[0]
    program = str(manifest.program)
    if "/" in first or first.startswith("."):
        return [program, *command[1:]], (), False
    index = next(i for i, arg in enumerate(command[1:], start=1) if not arg.startswith("-"))
    command[index] = program
    if first in PYTHON_COMMANDS:
        exe, readable = _python(confined)
        return [exe, *command[1:]], readable, True
    found = shutil.which(first)
    if found is None:
        raise PluginError(manifest.name, f"command[0] {first!r} is not on PATH; install it or give the "
                                         "program's path inside the plugin folder")
    return [found, *command[1:]], (), False


def plan_launch(manifest: PluginManifest, *, home: Path, policy: SandboxPolicy,
                base_env: Mapping[str, str] | None = None, egress: EgressCall | None = None) -> Launch:
    """The process to start for `manifest`, running in `home`, confined when `policy.safe`; with `egress`, in a
    network namespace of its own whose one way out is that egress proxy (heddle.workspace.egress_proxy)."""
    argv, readable, python = _argv(manifest, policy.safe)
    # A plugin is code a bundle brought, like a tool: heddle's own secrets stay with heddle.
    env = without_secrets(os.environ if base_env is None else base_env)
    own = {
        "HEDDLE_PLUGIN_NAME": manifest.name,
        "HEDDLE_PLUGIN_DIR": str(manifest.root),
        "HEDDLE_PLUGIN_HOME": str(home),
    }
    env.update(own)
    if python:
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    if not policy.safe:
        return Launch(tuple(argv), env, home)


    extra_read: list[Path] = [*readable]
    allow_env = [*policy.allow_env, *own]
    if python:
        source = _heddle_source_root()
        env["PYTHONPATH"] = str(source)
        allow_env += ["PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"]
        # Only the heddle package, so `import heddle.plugin` works and nothing beside it shows.
        extra_read.append(source / "heddle")
    confined = replace(policy, allow_read=(*policy.allow_read, *extra_read), allow_env=tuple(allow_env))
    argv, env = confine(confined, argv, workspace=_Home(home), tools_dir=manifest.root,  # type: ignore[arg-type]
                        env=env, egress=egress)
    return Launch(tuple(argv), env, home)
