"""The bundle a server serves: pulled first when `--bundle` is a reference, verified by the same
rules (and exit codes) as `heddle verify` before the port opens, and its temporary data folder
removed when the server stops."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy
    from heddle.oci import Pulled
    from heddle.server.config import ServerConfig


def pull_served(config: ServerConfig) -> Pulled:
    """The `--bundle`'s file: a path as it is, a reference pulled into the cache (with its OCI digest,
    which a following server compares the tag's with)."""
    from heddle.oci import source

    assert config.bundle is not None
    return source(config.bundle, plain_http=config.plain_http, offline=config.offline,
                  timeout=config.transfer_timeout)


def open_served(config: ServerConfig, trust: TrustPolicy, pulled: Pulled | None = None) -> Bundle:
    """The `--bundle` (or the file `pulled` for it) opened against `trust`, or the bundle error (each
    has its own exit code). Plugins given beside the bundle may add node types its sealed flow uses.
    A following server opens every new digest of its tag here too, against the same trust."""
    from heddle.bundle.verified import open_bundle
    from heddle.format.errors import BundleError

    pulled = pulled if pulled is not None else pull_served(config)
    try:
        return open_bundle(pulled.path, trust=trust, data_dir=config.data_dir, plugins=config.plugins)
    except BundleError as exc:
        if pulled.reference is None:
            raise
        # Named as the operator wrote it, not by its file in the cache.
        raise type(exc)(exc.message.replace(str(pulled.path), pulled.reference)) from None


def close_served(sealed: Bundle | None) -> None:
    """Remove the data folder opening made for `rw` mounts, unless the operator gave it."""
    from heddle.bundle.verified import remove_data_dir

    remove_data_dir(sealed)
