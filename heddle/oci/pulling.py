"""Resolving a reference and pulling its bundle into the cache.

A tag is resolved each time (one manifest request); a digest needs no request once its
artifact is in the cache. The layer is refused from the manifest's size when it is larger
than any bundle within the caps, is checked against its digest while it streams, and must be
a bundle (its head read, its digest the one the artifact's annotation states) before it is
renamed into the cache. With `offline`, nothing is asked of the network: a tag is the last
resolution this cache kept, and the artifact must be in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import httpx

from heddle.errors import UsageError
from heddle.format.errors import BundleError, BundleLimitError, ContentMismatchError
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.format.progress import Progress
from heddle.format.verify import peek
from heddle.oci.artifact import ArtifactManifest, Pulled, Resolved, digest_of, read_manifest
from heddle.oci.client import Registry, Session
from heddle.oci.errors import RegistryError
from heddle.oci.limits import TRANSFER_TIMEOUT_S
from heddle.oci.reference import Reference, UrlReference, parse_oci, parse_url
from heddle.oci.store import MANIFEST, PulledStore, key_digest, oci_key, url_key

# A bundle is zstd already: a server must send its bytes as they are.
_IDENTITY = {"Accept-Encoding": "identity"}


def _oci(ref: str | Reference) -> Reference:
    if isinstance(ref, Reference):
        return ref
    if not ref.lower().startswith("oci://"):
        raise UsageError(f"{ref}: resolving names an oci:// reference (a URL is downloaded, not resolved)")
    return parse_oci(ref)


def _resolved(reference: Reference, manifest: ArtifactManifest, *, offline: bool) -> Resolved:
    return Resolved(reference, manifest.digest, manifest.layer_size, manifest.annotations, manifest.layer_digest,
                    offline=offline, manifest=manifest.raw)


def _resolve_offline(reference: Reference, store: PulledStore) -> Resolved:
    if reference.digest is not None:
        key = oci_key(reference.digest)
    else:
        last = store.last(str(reference))
        if last is None or not last.startswith("oci-"):
            raise RegistryError(f"{reference}: --offline, and this tag was never pulled into the cache "
                                f"{store.root}; pull it once without --offline")
        key = last
    manifest = store.manifest(key)
    if manifest is None:
        raise RegistryError(f"{reference}: --offline, and {key_digest(key)} is not in the cache {store.root}; "
                            "pull it without --offline")
    return _resolved(reference, manifest, offline=True)


def resolve(ref: str | Reference, *, plain_http: bool = False, offline: bool = False,
            cache_dir: Path | None = None, environ: Mapping[str, str] | None = None,
            transport: httpx.BaseTransport | None = None, timeout: float | None = TRANSFER_TIMEOUT_S) -> Resolved:
    reference = _oci(ref)
    if offline:
        return _resolve_offline(reference, PulledStore(cache_dir))
    with Registry(reference, plain_http=plain_http, environ=environ, transport=transport,
                  deadline=timeout) as registry:
        raw, content_type, stated = registry.get_manifest(reference.target)
    digest = digest_of(raw)
    if reference.digest is not None and digest != reference.digest:
        raise ContentMismatchError(f"{reference}: the registry answered a manifest whose bytes hash to {digest}; "
                                   "it was not used")
    if stated is not None and stated.startswith("sha256:") and stated != digest:
        raise ContentMismatchError(f"{reference}: the registry says the manifest is {stated}, but its bytes hash to "
                                   f"{digest}; it was not used")
    return _resolved(reference, read_manifest(raw, what=str(reference), content_type=content_type), offline=False)


def check_size(size: int, limits: Limits, what: str) -> None:
    """Refuse, before a byte is downloaded, a bundle file larger than any within the caps."""
    cap = limits.max_archive_bytes()
    if size > cap:
        raise BundleLimitError(f"{what}: the bundle is {size} bytes, larger than any bundle within the caps "
                               f"({cap} bytes); it was not downloaded")


def _check_bundle(path: Path, stated: str | None, what: str, limits: Limits) -> None:
    """The downloaded file is a bundle (its frame and head read), and the one the artifact says."""
    try:
        seen = peek(path, limits=limits)
    except BundleError as exc:
        raise type(exc)(exc.message.replace(str(path), what)) from None
    if stated is not None and f"sha256:{seen.digest}" != stated:
        found = f"sha256:{seen.digest}" if seen.digest else "a format-1 bundle"
        raise ContentMismatchError(f"{what}: the artifact says it holds bundle {stated}, but its layer is {found}; "
                                   "it was not used")


def _download_layer(store: PulledStore, resolved: Resolved, *, plain_http: bool, limits: Limits,
                    environ: Mapping[str, str] | None, transport: httpx.BaseTransport | None,
                    timeout: float | None, progress: Progress | None) -> Path:
    reference = resolved.reference
    what = f"{reference} (layer {resolved.layer_digest})"
    with store.staging() as staged, Registry(reference, plain_http=plain_http, environ=environ,
                                             transport=transport, deadline=timeout) as registry:
        writer = staged.writer(what=what, exact=resolved.size)

        def write(chunk: bytes) -> None:
            writer.write(chunk)
            if progress is not None:
                progress.advance(len(chunk))

        try:
            with registry.blob(resolved.layer_digest) as response:
                length = response.headers.get("content-length")
                if length is not None and length.isdigit() and int(length) != resolved.size:
                    raise ContentMismatchError(f"{what}: the registry sends {length} bytes for a layer its manifest "
                                               f"says is {resolved.size}; it was not used")
                if progress is not None:
                    progress.start(resolved.size, f"pulling {reference.repository}")
                registry.stream_to(response, write, cap=resolved.size)
            got = writer.finish()
        finally:
            writer.close()
            if progress is not None:
                progress.finish()
        if got != resolved.layer_digest:
            raise ContentMismatchError(f"{what}: the downloaded bytes hash to {got}, not the layer's digest (changed "
                                       "in the registry or on the way); it was not used")
        _check_bundle(staged.bundle, resolved.bundle_digest, str(reference), limits)
        staged.add(MANIFEST, resolved.manifest)
        return staged.commit(oci_key(resolved.oci_digest), resolved.layer_digest, reference=str(reference))


def _pull_url(url: UrlReference, *, plain_http: bool, offline: bool, cache_dir: Path | None, limits: Limits,
              transport: httpx.BaseTransport | None, timeout: float | None, progress: Progress | None) -> Pulled:
    store = PulledStore(cache_dir)
    if offline:
        key = store.last(url.url)
        path = store.find(key, key_digest(key)) if key is not None else None
        if key is None or path is None:
            raise RegistryError(f"{url}: --offline, and it is not in the cache {store.root}; download it once "
                                "without --offline")
        store.touch(key)
        return Pulled(path, url.url)
    cap = limits.max_archive_bytes()
    with store.staging() as staged, Session(plain_http=plain_http, what=url.url, transport=transport,
                                            deadline=timeout) as session:
        response = session.send("GET", url.url, headers=_IDENTITY, stream=True)
        try:
            if response.status_code != 200:
                raise RegistryError(f"{url}: the server answered HTTP {response.status_code} "
                                    f"{response.reason_phrase}".rstrip())
            length = response.headers.get("content-length")
            if length is not None and length.isdigit():
                check_size(int(length), limits, url.url)
            # A bar only for a stated length: the cap alone says nothing of how far along a download is.
            shown = progress if length is not None and length.isdigit() else None
            writer = staged.writer(what=url.url, cap=cap)

            def write(chunk: bytes) -> None:
                writer.write(chunk)
                if shown is not None:
                    shown.advance(len(chunk))

            try:
                if shown is not None:
                    shown.start(int(length or 0), "downloading")
                session.stream_to(response, write, cap=cap)
                got = writer.finish()
            finally:
                writer.close()
                if shown is not None:
                    shown.finish()
        finally:
            response.close()
        _check_bundle(staged.bundle, None, url.url, limits)
        key = url_key(got)
        path = staged.commit(key, got, reference=url.url)
    store.record(url.url, key)
    store.touch(key)
    return Pulled(path, url.url, downloaded=True)


def pull(ref: str | Reference | UrlReference | Resolved, *, plain_http: bool = False, offline: bool = False,
         cache_dir: Path | None = None, limits: Limits = DEFAULT_LIMITS, environ: Mapping[str, str] | None = None,
         transport: httpx.BaseTransport | None = None, timeout: float | None = TRANSFER_TIMEOUT_S,
         progress: Progress | None = None) -> Pulled:
    if isinstance(ref, str):
        ref = parse_url(ref) if not ref.lower().startswith("oci://") else parse_oci(ref)
    if isinstance(ref, UrlReference):
        return _pull_url(ref, plain_http=plain_http, offline=offline, cache_dir=cache_dir, limits=limits,
                         transport=transport, timeout=timeout, progress=progress)
    resolved = ref if isinstance(ref, Resolved) else resolve(ref, plain_http=plain_http, offline=offline,
                                                             cache_dir=cache_dir, environ=environ,
                                                             transport=transport, timeout=timeout)
    store = PulledStore(cache_dir)
    key = oci_key(resolved.oci_digest)
    path = store.find(key, resolved.layer_digest)
    downloaded = path is None
    if path is None:
        if offline or resolved.offline:
            raise RegistryError(f"{resolved.reference}: --offline, and {resolved.oci_digest} is not in the cache "
                                f"{store.root}; pull it without --offline")
        check_size(resolved.size, limits, str(resolved.reference))
        path = _download_layer(store, resolved, plain_http=plain_http, limits=limits, environ=environ,
                               transport=transport, timeout=timeout, progress=progress)
    if resolved.reference.tag is not None and not resolved.offline:
        store.record(str(resolved.reference), key)
    store.touch(key)
    return Pulled(path, str(resolved.reference), resolved.oci_digest, resolved, downloaded)
