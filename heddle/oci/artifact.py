"""A bundle as an OCI artifact: an image manifest whose one layer is the .heddle file, unchanged.

```text
{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
 "artifactType": "application/vnd.heddle.bundle.v1",
 "config": the empty descriptor ({} , application/vnd.oci.empty.v1+json),
 "layers": [{"mediaType": "application/vnd.heddle.bundle.v1+zstd", "digest": ..., "size": ...}],
 "annotations": {"vnd.heddle.bundle.digest": "sha256:<manifest digest>", "vnd.heddle.bundle.name": ...,
                 "org.opencontainers.image.created": ..., and each --annotation}}
```

Reading one back refuses anything else (an image, an index, a second layer, another media
type) in one line, before a byte of its layer is fetched.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.format.errors import MalformedBundleError
from heddle.safeparse import ParseLimitError, loads_strict_json

if TYPE_CHECKING:
    from heddle.oci.reference import Reference

ARTIFACT_TYPE = "application/vnd.heddle.bundle.v1"
LAYER_TYPE = "application/vnd.heddle.bundle.v1+zstd"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
EMPTY_DIGEST = "sha256:" + hashlib.sha256(EMPTY_BLOB).hexdigest()
# What a manifest request accepts: ours, and the kinds it names when it refuses them.
ACCEPT = f"{MANIFEST_TYPE}, {INDEX_TYPE}, {DOCKER_MANIFEST_TYPE}, {DOCKER_LIST_TYPE}"

BUNDLE_DIGEST = "vnd.heddle.bundle.digest"
BUNDLE_NAME = "vnd.heddle.bundle.name"
CREATED = "org.opencontainers.image.created"
TITLE = "org.opencontainers.image.title"
# Set from the bundle itself: an --annotation may not say otherwise.
OWN_ANNOTATIONS = (BUNDLE_DIGEST, BUNDLE_NAME, CREATED)
# The distribution registry's own cap on a manifest.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_DEPTH = 16


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ArtifactManifest:
    """A heddle artifact's OCI manifest, as read from `raw` (whose sha256 is `digest`)."""

    raw: bytes
    digest: str
    layer_digest: str
    layer_size: int
    annotations: Mapping[str, str]

    @property
    def bundle_digest(self) -> str | None:
        return self.annotations.get(BUNDLE_DIGEST)


def build_manifest(*, layer_digest: str, layer_size: int, annotations: Mapping[str, str], title: str) -> bytes:
    """The manifest's bytes: sorted keys and no spaces, so one file pushed twice has one digest."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": EMPTY_DIGEST, "size": len(EMPTY_BLOB)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size,
                    "annotations": {TITLE: title}}],
        "annotations": dict(annotations),
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _kind(media_type: str) -> str | None:
    """What a manifest of another media type is, for the refusal."""
    if media_type in (INDEX_TYPE, DOCKER_LIST_TYPE):
        return "an image index (a list of manifests)"
    if media_type == DOCKER_MANIFEST_TYPE:
        return "a container image"
    return None


def _descriptor(value: Any, where: str, what: str) -> tuple[str, str, int]:
    if not isinstance(value, dict):
        raise MalformedBundleError(f"{what}: the OCI manifest's {where} is not a descriptor object")
    media_type, digest, size = value.get("mediaType"), value.get("digest"), value.get("size")
    if not isinstance(media_type, str):
        raise MalformedBundleError(f"{what}: the OCI manifest's {where} has no mediaType")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise MalformedBundleError(f"{what}: the OCI manifest's {where} digest {digest!r} is not sha256: and 64 "
                                   "lowercase hex digits")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise MalformedBundleError(f"{what}: the OCI manifest's {where} size {size!r} is not a whole number")
    return media_type, digest, size


def read_manifest(raw: bytes, *, what: str, content_type: str | None = None) -> ArtifactManifest:
    """The heddle artifact `raw` describes, or MalformedBundleError (exit 7) naming what it is instead."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise MalformedBundleError(f"{what}: the OCI manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        data = loads_strict_json(raw, max_depth=_MAX_DEPTH)
    except (ValueError, UnicodeDecodeError, ParseLimitError) as exc:
        raise MalformedBundleError(f"{what}: the OCI manifest is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MalformedBundleError(f"{what}: the OCI manifest is not a JSON object")
    media_type = data.get("mediaType") or (content_type or "").split(";")[0].strip()
    kind = _kind(media_type) if isinstance(media_type, str) else None
    if kind is not None:
        raise MalformedBundleError(f"{what} is {kind}, not a heddle bundle; push one with heddle push FILE.heddle")
    if media_type != MANIFEST_TYPE or data.get("schemaVersion") != 2:
        raise MalformedBundleError(f"{what}: not an OCI image manifest (mediaType {media_type!r}, schemaVersion "
                                   f"{data.get('schemaVersion')!r}), so not a heddle bundle")
    config_type, _, _ = _descriptor(data.get("config"), "config", what)
    # An artifact's type is its artifactType, or (as OCI 1.1 reads older artifacts) its config's.
    artifact_type = data.get("artifactType", config_type)
    if artifact_type != ARTIFACT_TYPE:
        raise MalformedBundleError(f"{what}: its artifact type is {artifact_type!r}, not {ARTIFACT_TYPE!r}: not a "
                                   "heddle bundle")
    layers = data.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        count = len(layers) if isinstance(layers, list) else "no list of"
        raise MalformedBundleError(f"{what}: a heddle artifact has exactly one layer, this one has {count} layers")
    layer_type, layer_digest, layer_size = _descriptor(layers[0], "layer", what)
    if layer_type != LAYER_TYPE:
        raise MalformedBundleError(f"{what}: its layer is {layer_type!r}, not {LAYER_TYPE!r}: not a heddle bundle")
    annotations = data.get("annotations", {})
    if not isinstance(annotations, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in annotations.items()):
        raise MalformedBundleError(f"{what}: the OCI manifest's annotations are not an object of strings")
    bundle_digest = annotations.get(BUNDLE_DIGEST)
    if bundle_digest is not None and not _DIGEST.fullmatch(bundle_digest):
        raise MalformedBundleError(f"{what}: its {BUNDLE_DIGEST} annotation {bundle_digest!r} is not a sha256 digest")
    return ArtifactManifest(raw, digest_of(raw), layer_digest, layer_size, dict(annotations))


@dataclass(frozen=True)
class Resolved:
    """What a reference names now: the OCI manifest digest, the bundle layer's size, the
    artifact's annotations. `offline` when it is the last resolution kept in the cache."""

    reference: Reference
    oci_digest: str
    size: int
    annotations: Mapping[str, str]
    layer_digest: str
    offline: bool = False
    manifest: bytes = field(default=b"", repr=False, compare=False)

    @property
    def bundle_digest(self) -> str | None:
        """The bundle's own digest as the artifact's annotation states it (checked when pulled)."""
        return self.annotations.get(BUNDLE_DIGEST)

    @property
    def pinned(self) -> Reference:
        """The reference by digest: what this resolution names for good."""
        return self.reference.at(self.oci_digest)


@dataclass(frozen=True)
class Pulled:
    """A bundle file to open: a local path as given, or a reference's file in the cache."""

    path: Path
    reference: str | None = None  # as given; None for a local path
    oci_digest: str | None = None  # the OCI manifest digest, for an oci:// reference
    resolved: Resolved | None = None
    downloaded: bool = False  # False when it came from the cache

    @property
    def name(self) -> str:
        """How messages name it: the reference, else the path."""
        return self.reference or str(self.path)


@dataclass(frozen=True)
class Pushed:
    oci_digest: str
    bundle_digest: str
    reference: Reference  # as pushed: with its tag, or none
    size: int
    annotations: Mapping[str, str]

    @property
    def pinned(self) -> Reference:
        return self.reference.at(self.oci_digest)
