"""Bundles in OCI registries, and bundles at https:// URLs.

A bundle is pushed as the one layer of an OCI artifact (heddle.oci.artifact), unchanged; what
is pulled is checked against the OCI digest while it streams, kept in the cache by that digest
(heddle.oci.store), and then verified exactly as a local file is: pulling never weakens
verification. The functions here are the library's API; they import the HTTP stack only when
called, so a command that never names a reference never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.oci.limits import TRANSFER_TIMEOUT_S

if TYPE_CHECKING:
    from heddle.format.progress import Progress
    from heddle.oci.artifact import Pulled, Pushed, Resolved
    from heddle.oci.reference import Reference, UrlReference

__all__ = ["TRANSFER_TIMEOUT_S", "Pulled", "Pushed", "Resolved", "fetch", "pull", "push", "resolve", "source"]


def __getattr__(name: str) -> Any:
    # The artifact's names load on first use: the flag table reads TRANSFER_TIMEOUT_S before --help.
    if name in ("Pulled", "Pushed", "Resolved"):
        from heddle.oci import artifact

        return getattr(artifact, name)
    raise AttributeError(f"module 'heddle.oci' has no attribute {name!r}")

def resolve(ref: str | Reference, *, plain_http: bool = False, offline: bool = False,
            cache_dir: Path | None = None, environ: Mapping[str, str] | None = None,
            timeout: float | None = TRANSFER_TIMEOUT_S) -> Resolved:
    """Ask the registry what `ref` (an `oci://` tag or digest) names now, without downloading the
    bundle; with `offline`, the last resolution kept in the cache. Raises RegistryError (exit 2)
    or the bundle error of an artifact that is not a heddle bundle (exit 7)."""
    from heddle.oci.pulling import resolve as resolve_

    return resolve_(ref, plain_http=plain_http, offline=offline, cache_dir=cache_dir, environ=environ,
                    timeout=timeout)


def pull(ref: str | Reference | UrlReference | Resolved, *, plain_http: bool = False, offline: bool = False,
         cache_dir: Path | None = None, limits: Limits = DEFAULT_LIMITS,
         environ: Mapping[str, str] | None = None, timeout: float | None = TRANSFER_TIMEOUT_S,
         progress: Progress | None = None) -> Pulled:
    """`fetch`, with what was fetched: the file, the reference and its OCI digest. `progress` is told
    the bytes of the download as they arrive (none when the bundle is in the cache already)."""
    from heddle.oci.pulling import pull as pull_

    return pull_(ref, plain_http=plain_http, offline=offline, cache_dir=cache_dir, limits=limits, environ=environ,
                 timeout=timeout, progress=progress)


def fetch(ref: str | Reference | UrlReference | Resolved, *, plain_http: bool = False, offline: bool = False,
          cache_dir: Path | None = None, limits: Limits = DEFAULT_LIMITS,
          environ: Mapping[str, str] | None = None, timeout: float | None = TRANSFER_TIMEOUT_S) -> Path:
    """The pulled .heddle file in the cache (keyed by OCI digest, or a URL's file by its sha256).
    A `Resolved` is fetched exactly (no second resolution). The blob is checked against its
    digest while it streams; a layer over the bundle caps is refused from the manifest's size
    before a byte is downloaded. The file is not verified: open it as any bundle."""
    return pull(ref, plain_http=plain_http, offline=offline, cache_dir=cache_dir, limits=limits,
                environ=environ, timeout=timeout).path


def push(path: str | os.PathLike[str], ref: str | Reference, *, annotations: Mapping[str, str] | None = None,
         plain_http: bool = False, environ: Mapping[str, str] | None = None,
         progress: Progress | None = None) -> Pushed:
    """Push the bundle at `path` unchanged as the one layer of an OCI artifact at `ref`
    (`oci://REGISTRY/REPO[:TAG]`; without a tag, by digest alone). `progress` is told the bytes of
    the upload as they are sent (none when the registry has the layer already)."""
    from heddle.oci.pushing import push as push_

    return push_(path, ref, annotations=annotations, plain_http=plain_http, environ=environ, progress=progress)


def source(text: str | os.PathLike[str], *, plain_http: bool = False, offline: bool = False,
           cache_dir: Path | None = None, environ: Mapping[str, str] | None = None,
           timeout: float | None = TRANSFER_TIMEOUT_S) -> Pulled:
    """What a command's BUNDLE argument (or heddle-server's --bundle) names: a path, as it is, or
    a reference (`oci://...`, `https://...`) pulled into the cache. `--plain-http` and
    `--offline` given with a path are refused: they would be read and ignored."""
    from heddle.oci.reference import looks_like_reference

    if isinstance(text, str) and looks_like_reference(text):
        from heddle.oci.reference import parse_reference

        return pull(parse_reference(text), plain_http=plain_http, offline=offline, cache_dir=cache_dir,
                    environ=environ, timeout=timeout)
    given = [flag for flag, on in (("--plain-http", plain_http), ("--offline", offline)) if on]
    if given:
        from heddle.errors import UsageError

        raise UsageError(f"{' and '.join(given)} apply to a bundle reference (oci://REGISTRY/REPO:TAG or an "
                         f"https:// URL); {os.fspath(text)} is a file: leave {'them' if len(given) > 1 else 'it'} out")
    from heddle.oci.artifact import Pulled

    return Pulled(Path(text))
