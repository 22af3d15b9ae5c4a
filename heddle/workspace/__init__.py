"""Workspaces, mounts and safe mode: where a node's tools run and what they can reach.

Names are imported on first use: the flag table reads the mount caps' defaults here before `--help`.
"""

import importlib
from typing import TYPE_CHECKING, Any

# The most files and folders, and bytes, one mount may hold (`--mount-max-entries`, `--mount-max-bytes`).
MOUNT_MAX_ENTRIES, MOUNT_MAX_BYTES = 4096, 64 * 2**20

_WHERE = {"Mount": "mounts", "check_mounts": "mounts", "parse_mount": "mounts", "SandboxPolicy": "sandbox",
          "check_policy": "sandbox", "confine": "sandbox", "Workspace": "workspace",
          "WorkspaceOptions": "workspace", "Workspaces": "workspace"}
__all__ = ["Mount", "SandboxPolicy", "Workspace", "WorkspaceOptions", "Workspaces", "check_mounts", "check_policy",
           "confine", "parse_mount"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'heddle.workspace' has no attribute {name!r}")
    return getattr(importlib.import_module(f"heddle.workspace.{_WHERE[name]}"), name)


if TYPE_CHECKING:
    from heddle.workspace.mounts import Mount, check_mounts, parse_mount
    from heddle.workspace.sandbox import SandboxPolicy, check_policy, confine
    from heddle.workspace.workspace import Workspace, WorkspaceOptions, Workspaces
