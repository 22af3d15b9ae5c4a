"""Safe mode: each tool call in its own bubblewrap sandbox.

The sandbox sees the system directories read-only, a fresh `/tmp` with an empty `HOME`,
the tools read-only, and its workspace as the only writable place (with `.heddle` and the
`ro` mounts read-only inside it). Everything else of the machine is simply not there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.errors import RunError, UsageError
from heddle.secret_env import SECRET_ENV, without_secrets

if TYPE_CHECKING:
    from heddle.workspace.workspace import Workspace

BACKENDS = ("auto", "bubblewrap")

SYSTEM_DIRS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
)

# What a sandboxed tool keeps of the environment it is given: a few harmless settings, the
# variables heddle sets for it, and nothing else unless `--allow-env` names it. A prefix rule
# (`HEDDLE_*`) would hand over heddle's own secrets, which share that prefix.
KEPT_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "TERM")
HEDDLE_SET_ENV = ("HEDDLE_WORKSPACE", "HEDDLE_WORKSPACE_BIN")

SANDBOX_TMP = "/tmp"
SANDBOX_HOME = "/tmp/home"

# The flags that only mean something under --safe, by the CLI name a user typed.
SAFE_ONLY_FLAGS = ("--sandbox", "--allow-read", "--allow-write", "--allow-env", "--deny-net")

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; "
    "Fedora: dnf install bubblewrap)"
)

# New user, pid, ipc and uts namespaces; the sandbox dies with heddle and cannot reach
# the controlling terminal.
_NAMESPACES = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--die-with-parent",
    "--new-session",
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class SandboxPolicy:
    safe: bool = False
    backend: str = "auto"
    allow_read: tuple[Path, ...] = ()
    allow_write: tuple[Path, ...] = ()
    allow_env: tuple[str, ...] = ()
    deny_net: bool = False


def _set_flags(policy: SandboxPolicy) -> list[str]:
    """The safe-only flags a policy uses, for callers that build policies without a CLI."""
    used = []
    if policy.backend != "auto":
        used.append("--sandbox")
    if policy.allow_read:
        used.append("--allow-read")
    if policy.allow_write:
        used.append("--allow-write")
    if policy.allow_env:
        used.append("--allow-env")
    if policy.deny_net:
        used.append("--deny-net")
    return used


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _require_bwrap() -> str:
    if not sys.platform.startswith("linux"):
        raise UsageError(f"--safe needs Linux with bubblewrap; this is {sys.platform}")
    bwrap = find_bwrap()
    if bwrap is None:
        raise UsageError(f"--safe needs bubblewrap and 'bwrap' is not on PATH; {INSTALL_HINT}")
    return bwrap


def _probe(bwrap: str) -> None:
    """Run an empty sandbox once, so a kernel without user namespaces fails at start-up. It mounts a
    /proc and a /dev as every tool's sandbox does: a container whose /proc is masked allows the
    namespaces but not that mount, and must fail here too, not at a run's first tool call."""
    true = shutil.which("true") or "/bin/true"
    argv = [bwrap, "--ro-bind", "/", "/", *_NAMESPACES, "--proc", "/proc", "--dev", "/dev", "--cap-drop", "ALL",
            "--", true]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--safe: cannot run {bwrap}: {exc}; {INSTALL_HINT}") from None
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        reason = detail[-1] if detail else f"exit status {done.returncode}"
        raise UsageError(
            f"--safe: bubblewrap cannot create a sandbox here ({reason}); "
            "enable unprivileged user namespaces or run where they are allowed"
        )


def check_policy(policy: SandboxPolicy, *, explicitly_set: Sequence[str] = ()) -> None:
    """Start-up refusals for the sandbox flags. Call before any node runs."""
    if policy.backend not in BACKENDS:
        raise UsageError(f"--sandbox {policy.backend!r}: unknown; use auto or bubblewrap")
    if not policy.safe:
        named = [f for f in SAFE_ONLY_FLAGS if f in explicitly_set or f in _set_flags(policy)]
        if named:
            verb = "works" if len(named) == 1 else "work"
            raise UsageError(
                f"{', '.join(named)} only {verb} with --safe and would be ignored; "
                "add --safe or drop them"
            )
        return
    for name in policy.allow_env:
        if not _ENV_NAME.match(name):
            raise UsageError(
                f"--allow-env {name!r}: not an environment variable name; give NAME only"
            )
        if name in SECRET_ENV:
            raise UsageError(
                f"--allow-env {name}: heddle's own secret, never passed to a tool; "
                "give the tool its value under another name"
            )
    for flag, paths in (("--allow-read", policy.allow_read), ("--allow-write", policy.allow_write)):
        for path in paths:
            if not os.path.exists(path):
                raise UsageError(f"{flag} {path}: does not exist; give an existing file or folder")
    _probe(_require_bwrap())


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _covered(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def sandbox_env(policy: SandboxPolicy, env: dict[str, str]) -> dict[str, str]:
    """The environment a sandboxed tool gets: a short list, heddle's own settings for it, and
    `--allow-env`; heddle's secrets never, whatever a policy built without the CLI says."""
    allowed = (set(KEPT_ENV) | set(HEDDLE_SET_ENV) | set(policy.allow_env)) - SECRET_ENV
    out = {k: v for k, v in env.items() if k in allowed}
    out["HOME"] = SANDBOX_HOME
    out["TMPDIR"] = SANDBOX_TMP
    return out


def bwrap_args(
    policy: SandboxPolicy,
    argv: Sequence[str],
    *,
    workspace: Workspace,
    tools_dir: Path | None,
    chdir: Path | None = None,
) -> list[str]:
    """The bubblewrap command line that runs `argv` inside the policy's sandbox, in `chdir` (default:
    the workspace)."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise RunError(f"--safe needs bubblewrap and 'bwrap' is not on PATH; {INSTALL_HINT}")

    # (path, options) pairs; bubblewrap applies them in order, so after a stable sort by
    # depth every bind lands on top of its parents and never under them.
    ops: list[tuple[str, list[str]]] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            ops.append((d, ["--symlink", os.readlink(d), d]))
        elif os.path.isdir(d):
            ops.append((d, ["--ro-bind", d, d]))
    ops.append(("/proc", ["--proc", "/proc"]))
    ops.append(("/dev", ["--dev", "/dev"]))
    for p in policy.allow_read:
        r = _real(p)
        ops.append((r, ["--ro-bind", r, r]))
    for p in policy.allow_write:
        r = _real(p)
        ops.append((r, ["--bind", r, r]))
    # After the allow-lists, so that at equal depth `/tmp` stays private even under
    # `--allow-read /tmp`; paths below it can still be allowed.
    ops.append((SANDBOX_TMP, ["--tmpfs", SANDBOX_TMP]))
    ops.append((SANDBOX_HOME, ["--dir", SANDBOX_HOME]))
    readable = [*SYSTEM_DIRS, *(_real(p) for p in policy.allow_read + policy.allow_write)]
    if tools_dir is not None:
        r = _real(tools_dir)
        ops.append((r, ["--ro-bind", r, r]))
        readable.append(r)
    root = _real(workspace.root)
    readable.append(root)
    if argv and os.path.isabs(argv[0]):
        exe = _real(argv[0])
        if not _covered(exe, readable):
            ops.append((exe, ["--ro-bind", exe, exe]))
    ops.append((root, ["--bind", root, root]))
    for p in workspace.ro_binds():
        ops.append((str(p), ["--ro-bind", str(p), str(p)]))
    ops.sort(key=lambda op: _depth(op[0]))

    args = [bwrap, *_NAMESPACES, "--cap-drop", "ALL"]
    if policy.deny_net:
        args.append("--unshare-net")
    for _, opts in ops:
        args.extend(opts)
    args.extend(["--chdir", _real(chdir) if chdir is not None else root, "--"])
    args.extend(argv)
    return args


def confine(
    policy: SandboxPolicy,
    argv: list[str],
    *,
    workspace: Workspace,
    tools_dir: Path | None,
    env: dict[str, str],
    chdir: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment to exec for one tool call: sandboxed under --safe, else as given
    less heddle's own secrets. `chdir` is where a sandboxed call starts, when not its workspace (it
    must be the workspace, `tools_dir` or under one of them, to be there at all)."""
    if not policy.safe:
        return list(argv), without_secrets(env)
    return (
        bwrap_args(policy, argv, workspace=workspace, tools_dir=tools_dir, chdir=chdir),
        sandbox_env(policy, env),
    )
