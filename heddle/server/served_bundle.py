"""The bundle a server serves: verified by the same rules (and exit codes) as `heddle verify`
before the port opens, and its temporary data folder removed when the server stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.bundle.runnable import SealedRun
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy
    from heddle.server.config import ServerConfig


def open_served(config: ServerConfig, trust: TrustPolicy) -> Bundle:
    """The `--bundle` opened against `trust`, or the bundle error (each has its own exit code).
    Plugins given beside the bundle may add node types its sealed flow uses."""
    from heddle.bundle.verified import open_bundle

    assert config.bundle is not None
    return open_bundle(config.bundle, trust=trust, data_dir=config.data_dir, plugins=config.plugins)


def digest_of(sealed: SealedRun) -> str:
    """The digest as the server reports it: always with its `sha256:`."""
    digest = str(sealed.digest)
    return digest if digest.startswith("sha256:") else f"sha256:{digest}"


def close_served(sealed: SealedRun | None) -> None:
    """Remove the data folder opening made for `rw` mounts, unless the operator gave it."""
    from heddle.bundle.verified import remove_data_dir

    remove_data_dir(sealed)
