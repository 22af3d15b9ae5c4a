"""Pushing a bundle file, unchanged, as the one layer of an OCI artifact.

The file's head is read first (a file that is not a bundle is refused before anything is
sent), then the empty config and the layer are uploaded unless the registry has them, then
the manifest, under the tag or by its digest. The same file pushed twice makes the same
manifest: its annotations come from the bundle (digest, name, the time it was sealed), not
from the clock.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from heddle.errors import UsageError
from heddle.format.archive import read_head
from heddle.format.frame import GZIP_MAGIC
from heddle.format.limits import DEFAULT_LIMITS
from heddle.format.progress import Progress
from heddle.format.signing import Signatures
from heddle.format.verify import open_file, sealed_manifest
from heddle.oci.artifact import (
    BUNDLE_DIGEST,
    BUNDLE_NAME,
    CREATED,
    EMPTY_BLOB,
    EMPTY_DIGEST,
    OWN_ANNOTATIONS,
    Pushed,
    build_manifest,
    digest_of,
)
from heddle.oci.client import CHUNK, Registry
from heddle.oci.errors import RegistryError
from heddle.oci.reference import Reference, parse_oci

_TITLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


@dataclass(frozen=True)
class BundleFile:
    """What a push reads of the file: its bundle digest, name and sealing time, its size and sha256."""

    path: Path
    bundle_digest: str
    name: str
    created: str
    size: int
    sha256: str


def read_bundle_file(path: Path) -> BundleFile:
    """The file's head, checked as `heddle inspect` checks it, and its own digest."""
    what = str(path)
    with open_file(path) as fh:
        if fh.read(2) == GZIP_MAGIC:
            raise UsageError(f"{path}: a format-1 (gzip) bundle; seal it again with this heddle to push it")
        head = read_head(fh, what=what, limits=DEFAULT_LIMITS)
        Signatures.from_bytes(head.signatures_bytes, limits=DEFAULT_LIMITS, what=f"{what} signatures")
        manifest = sealed_manifest(head, what=what, limits=DEFAULT_LIMITS)
        fh.seek(0)
        digest = hashlib.sha256()
        size = 0
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    created = datetime.fromtimestamp(head.mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return BundleFile(path, "sha256:" + hashlib.sha256(head.manifest_bytes).hexdigest(), manifest.name, created,
                      size, "sha256:" + digest.hexdigest())


def check_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in annotations.items():
        if not key or key != key.strip() or any(c.isspace() for c in key):
            raise UsageError(f"--annotation {key!r}: an annotation key is a non-empty name without spaces, such as "
                             "org.opencontainers.image.source")
        if key in OWN_ANNOTATIONS:
            raise UsageError(f"--annotation {key}: heddle sets it from the bundle itself; leave it out")
        out[key] = value
    return out


def _chunks(path: Path, expected: str, size: int, progress: Progress | None, label: str) -> Iterator[bytes]:
    """The file's bytes, once more; refused if they are no longer the ones hashed."""
    digest = hashlib.sha256()
    if progress is not None:
        # Started here, so that a body sent again (after an auth challenge) starts the bar again.
        progress.start(size, label)
    with open_file(path) as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress.advance(len(chunk))
            yield chunk
    if "sha256:" + digest.hexdigest() != expected:
        raise UsageError(f"{path} changed while it was pushed; push it again once nothing writes it")


def push(path: str | os.PathLike[str], ref: str | Reference, *, annotations: Mapping[str, str] | None = None,
         plain_http: bool = False, environ: Mapping[str, str] | None = None,
         transport: httpx.BaseTransport | None = None, progress: Progress | None = None) -> Pushed:
    reference = parse_oci(ref, for_push=True) if isinstance(ref, str) else ref
    if reference.digest is not None:
        raise UsageError(f"{reference}: a push names a tag, or no tag, never a digest: the digest is the "
                         "artifact's own, printed once it is pushed")
    extra = check_annotations(annotations or {})
    bundle = read_bundle_file(Path(path))
    own = {BUNDLE_DIGEST: bundle.bundle_digest, BUNDLE_NAME: bundle.name, CREATED: bundle.created}
    title = f"{bundle.name}.heddle" if _TITLE.fullmatch(bundle.name) else "bundle.heddle"
    raw = build_manifest(layer_digest=bundle.sha256, layer_size=bundle.size, annotations={**extra, **own},
                         title=title)
    oci_digest = digest_of(raw)
    # No deadline on the whole push: an upload takes as long as the bundle's size needs (the registry's
    # silence still ends it, and its answers are read within their caps).
    with Registry(reference, plain_http=plain_http, push=True, environ=environ, transport=transport,
                  deadline=None) as registry:
        if not registry.has_blob(EMPTY_DIGEST, len(EMPTY_BLOB)):
            registry.upload_blob(EMPTY_DIGEST, len(EMPTY_BLOB), EMPTY_BLOB)
        if not registry.has_blob(bundle.sha256, bundle.size):
            try:
                registry.upload_blob(bundle.sha256, bundle.size,
                                     lambda: _chunks(bundle.path, bundle.sha256, bundle.size, progress,
                                                     f"pushing {reference.repository}"))
            finally:
                if progress is not None:
                    progress.finish()
        stored = registry.put_manifest(reference.tag or oci_digest, raw)
    if stored is not None and stored.startswith("sha256:") and stored != oci_digest:
        raise RegistryError(f"{reference}: the registry stored the manifest as {stored}, not {oci_digest}, the "
                            "digest of the bytes sent")
    return Pushed(oci_digest, bundle.bundle_digest, reference, bundle.size, {**extra, **own})
