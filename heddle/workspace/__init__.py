"""Workspaces, mounts and safe mode: where a node's tools run and what they can reach."""

from heddle.workspace.mounts import Mount, check_mounts, parse_mount
from heddle.workspace.sandbox import SandboxPolicy, check_policy, confine
from heddle.workspace.workspace import Workspace, WorkspaceOptions, Workspaces

__all__ = [
    "Mount",
    "SandboxPolicy",
    "Workspace",
    "WorkspaceOptions",
    "Workspaces",
    "check_mounts",
    "check_policy",
    "confine",
    "parse_mount",
]
