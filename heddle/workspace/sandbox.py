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
from heddle.workspace.egress_proxy import PYTHON, SANDBOX_CA, SANDBOX_SOCKET, relay_argv, runner_problem

if TYPE_CHECKING:
    from heddle.workspace.egress_proxy import EgressCall
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
HEDDLE_SET_ENV = ("HEDDLE_WORKSPACE", "HEDDLE_WORKSPACE_BIN", "TRACEPARENT")

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
    # --require-isolation: "sandbox" or "netns" (ISOLATION_LEVELS), refused where it cannot be had.
    require_isolation: str | None = None


def backend_name(policy: SandboxPolicy) -> str:
    """The backend a --safe call runs in: `auto` is bubblewrap, the one there is (BACKENDS)."""
    return "bubblewrap" if policy.backend == "auto" else policy.backend


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


ISOLATION_LEVELS = ("sandbox", "netns")


def _bwrap_works(bwrap: str, *extra: str) -> str | None:
    """None when an empty sandbox with `extra` flags runs here, else why not."""
    true = shutil.which("true") or "/bin/true"
    argv = [bwrap, "--ro-bind", "/", "/", *_NAMESPACES, *extra, "--proc", "/proc", "--dev", "/dev",
            "--cap-drop", "ALL", "--", true]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {bwrap}: {exc}"
    if done.returncode != 0:
        detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return detail[-1] if detail else f"exit status {done.returncode}"
    return None


def isolation_layers() -> list[tuple[str, bool, str]]:
    """(layer, enforced here, why) for each layer of a tool's isolation heddle knows: `heddle doctor`'s
    report, and what --require-isolation is checked against."""
    bwrap = find_bwrap() if sys.platform.startswith("linux") else None
    if bwrap is None:
        why = f"bubblewrap is not here; {INSTALL_HINT}" if sys.platform.startswith("linux") else \
            f"it needs Linux; this is {sys.platform}"
        sandbox: str | None = why
        netns: str | None = why
    else:
        sandbox = _bwrap_works(bwrap)
        netns = sandbox or _bwrap_works(bwrap, "--unshare-net")
    # A tool call's proxy listens in its namespace where the kernel allows it; else, as for MCP servers' and
    # plugins' processes, a relay run by the system's Python in the sandbox.
    listens = netns is None and runner_problem() is None
    proxy = netns or (None if listens or os.access(PYTHON, os.X_OK) else
                      f"{PYTHON} (the relay inside the sandbox) is not here")
    how = "listening in each tool call's namespace" if listens else \
        f"reached through a relay ({PYTHON}) in each call's namespace"
    return [
        ("sandbox", sandbox is None, "--safe: bubblewrap with user, pid, ipc and uts namespaces, the system "
         "read-only" if sandbox is None else f"--safe cannot work: {sandbox}"),
        ("netns", netns is None, "a network namespace per tool call (--deny-net, or a bundle's egress list)"
         if netns is None else f"no network namespace per call: {netns}"),
        ("proxy", proxy is None, f"the egress proxy, {how}" if proxy is None else
         f"no egress proxy for tools: {proxy}"),
        ("seccomp", False, "heddle adds no seccomp filter of its own"),
        ("rlimits", False, "heddle sets no resource limits on tools beyond their time and output caps"),
    ]


def check_isolation(policy: SandboxPolicy, *, egress: bool) -> None:
    """--require-isolation: refused before anything runs where the level cannot be had, naming what is
    missing; `egress` says whether the run's tools go through an egress proxy (a bundle's list)."""
    level = policy.require_isolation
    if level is None or level == "none":
        return
    if level not in ISOLATION_LEVELS:
        raise UsageError(f"--require-isolation {level!r}: unknown; give one of none, {', '.join(ISOLATION_LEVELS)}")
    if not policy.safe:
        raise UsageError(f"--require-isolation {level}: the run is not under --safe, so its tools are not "
                         "sandboxed; add --safe")
    if level == "netns" and not (policy.deny_net or egress):
        raise UsageError("--require-isolation netns: this run's tools would share the machine's network (the "
                         "bundle declares no egress allow-list and --deny-net is not given); add --deny-net or "
                         "seal an egress list")
    wanted = ("sandbox",) if level == "sandbox" else ("sandbox", "netns") if policy.deny_net else \
        ("sandbox", "netns", "proxy")
    for layer, ok, why in isolation_layers():
        if layer in wanted and not ok:
            raise UsageError(f"--require-isolation {level}: {why}")


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _covered(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def sandbox_env(policy: SandboxPolicy, env: dict[str, str], *, egress: EgressCall | None = None) -> dict[str, str]:
    """The environment a sandboxed tool gets: a short list, heddle's own settings for it, and
    `--allow-env`; heddle's secrets never, whatever a policy built without the CLI says. With `egress`,
    what a call through the egress proxy is given (heddle.workspace.egress_proxy)."""
    allowed = (set(KEPT_ENV) | set(HEDDLE_SET_ENV) | set(policy.allow_env)) - SECRET_ENV
    out = {k: v for k, v in env.items() if k in allowed}
    out["HOME"] = SANDBOX_HOME
    out["TMPDIR"] = SANDBOX_TMP
    if egress is not None:
        out.update(egress.env)
    return out


def bwrap_args(
    policy: SandboxPolicy,
    argv: Sequence[str],
    *,
    workspace: Workspace,
    tools_dir: Path | None,
    chdir: Path | None = None,
    egress: EgressCall | None = None,
) -> list[str]:
    """The bubblewrap command line that runs `argv` inside the policy's sandbox, in `chdir` (default:
    the workspace). With `egress` (heddle's egress proxy for this call) the sandbox has a network
    namespace of its own and the proxy's authority bound in; and either the proxy's socket bound in and the
    relay run before `argv`, or (`egress.runner`) neither: run_process then has the proxy's listener made in
    the sandbox's namespace before `argv` starts (heddle.tools.spawner.own_network_argv)."""
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
    relay: list[str] = []
    if egress is not None:
        if egress.runner is None:  # else heddle's listener is made in the sandbox's namespace (run_process)
            ops.append((SANDBOX_SOCKET, ["--bind", egress.socket, SANDBOX_SOCKET]))
            relay = relay_argv()
        if egress.ca_file is not None:
            ops.append((SANDBOX_CA, ["--ro-bind", egress.ca_file, SANDBOX_CA]))
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
    if policy.deny_net or egress is not None:
        args.append("--unshare-net")
    for _, opts in ops:
        args.extend(opts)
    args.extend(["--chdir", _real(chdir) if chdir is not None else root, "--"])
    args.extend(relay)
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
    egress: EgressCall | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment to exec for one tool call: sandboxed under --safe, else as given
    less heddle's own secrets. `chdir` is where a sandboxed call starts, when not its workspace (it
    must be the workspace, `tools_dir` or under one of them, to be there at all). `egress`: the call
    reaches the network through heddle's egress proxy alone (heddle.workspace.egress_proxy)."""
    if not policy.safe:
        return list(argv), without_secrets(env)
    if policy.deny_net:
        egress = None
    return (
        bwrap_args(policy, argv, workspace=workspace, tools_dir=tools_dir, chdir=chdir, egress=egress),
        sandbox_env(policy, env, egress=egress),
    )
