"""`flowPath`: a flow document named relative to `--flows-root`, and nothing outside it.

Every refusal (absolute path, `..`, a link leading out, no such file) gives the same 404, so a
caller cannot probe the server's files.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from heddle.server.errors import ApiError

MAX_FLOW_BYTES = 4 << 20


def not_found(name: str) -> ApiError:
    return ApiError(404, "flow_not_found", f"flowPath {name!r}: no flow by that name under this server's flows root")


def resolve_flow_path(root: Path, name: str) -> Path:
    """The real path of `name` under `root`, or the 404."""
    if not name or "\0" in name or "\\" in name:
        raise not_found(name)
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise not_found(name)
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, *rel.parts))
    if os.path.commonpath([real_root, target]) != real_root or target == real_root:
        raise not_found(name)
    if not os.path.isfile(target):
        raise not_found(name)
    return Path(target)


def read_flow_text(root: Path, name: str) -> str:
    path = resolve_flow_path(root, name)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FLOW_BYTES + 1)
    except OSError:
        raise not_found(name) from None
    if len(data) > MAX_FLOW_BYTES:
        raise ApiError(400, "invalid_flow", f"flowPath {name!r}: the document is over {MAX_FLOW_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_flow", f"flowPath {name!r}: is not UTF-8 text") from None
