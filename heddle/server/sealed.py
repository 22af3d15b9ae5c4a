"""The bundle a server serves: verified by the same rules (and exit codes) as `heddle verify`
before the port opens, and its temporary data folder removed when the server stops."""

from __future__ import annotations

import shutil
from typing import Any

from heddle.server.config import ServerConfig


def open_sealed(config: ServerConfig) -> Any:
    """A `heddle.bundle.runnable.SealedRun`, or the bundle error (each has its own exit code)."""
    from heddle.bundle.runnable import open_runnable

    assert config.bundle is not None
    node_types: frozenset[str] = frozenset()
    if config.plugins:
        from heddle.plugin_host.carried import read_carried

        # Plugins given beside the bundle may add node types its sealed flow uses.
        node_types = read_carried(config.plugins).node_types
    return open_runnable(config.bundle, trust=list(config.trust), allow_unsigned=config.allow_unsigned,
                         data_dir=config.data_dir, node_types=node_types)


def digest_of(sealed: Any) -> str:
    digest = str(sealed.digest)
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


def close_sealed(sealed: Any) -> None:
    """Remove the data folder opening made for `rw` mounts, unless the operator gave it."""
    if sealed is not None and getattr(sealed, "data_dir_created", False) and sealed.data_dir is not None:
        shutil.rmtree(sealed.data_dir, ignore_errors=True)
