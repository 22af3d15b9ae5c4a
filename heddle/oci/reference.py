"""What a bundle reference on a command line is: `oci://REGISTRY/REPOSITORY:TAG`,
`oci://REGISTRY/REPOSITORY@sha256:DIGEST`, or an `https://` URL of a .heddle file.

Parsed exactly or refused in one line: no registry is assumed (the registry is always the
first part), no tag defaults to `latest`, and a reference that names both a tag and a
digest is refused rather than one of them silently ignored. Only the standard library is
imported, so the CLI can tell a reference from a path without loading an HTTP stack.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from heddle.errors import UsageError

OCI_SCHEME = "oci://"
URL_SCHEMES = ("https://", "http://")
FORMS = "oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST"

# The distribution specification's grammar for names, tags and digests.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_ALGORITHM = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:.*")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_MAX_NAME = 255
# Docker Hub's names and the host its registry API answers on.
_HUB = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def looks_like_reference(text: str) -> bool:
    """Whether `text` is written as a reference (and so is parsed as one, never as a path)."""
    lowered = text[:8].lower()
    return lowered.startswith(OCI_SCHEME) or lowered.startswith(URL_SCHEMES)


@dataclass(frozen=True)
class Reference:
    """An artifact in an OCI registry. Exactly one of `tag` and `digest` is set, except for a
    push, whose reference may name neither (the artifact is then pushed by digest alone)."""

    registry: str  # host[:port], as written
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def host(self) -> str:
        if self.registry.startswith("["):
            return self.registry[: self.registry.index("]") + 1]
        return self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def endpoint(self) -> str:
        """The host[:port] the registry API answers on (Docker Hub's differs from its name)."""
        return _HUB.get(self.registry.lower(), self.registry)

    @property
    def target(self) -> str:
        """What the manifest is asked for by: the digest, else the tag."""
        target = self.digest or self.tag
        assert target is not None, "a reference to pull names a tag or a digest"
        return target

    def at(self, digest: str) -> Reference:
        """The same repository, pinned to `digest`."""
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        text = f"{OCI_SCHEME}{self.registry}/{self.repository}"
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


@dataclass(frozen=True)
class UrlReference:
    """A .heddle file served over HTTP(S)."""

    url: str

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        return self.url


def _refuse(text: str, why: str) -> UsageError:
    return UsageError(f"{text}: {why}; write {FORMS}")


def _check_registry(text: str, registry: str) -> None:
    if not registry:
        raise _refuse(text, "no registry before the repository")
    host, port = registry, None
    if registry.startswith("["):
        end = registry.find("]")
        if end < 0:
            raise _refuse(text, f"the registry {registry!r} opens an IPv6 address it does not close")
        host, rest = registry[: end + 1], registry[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise _refuse(text, f"the registry {registry!r} is not an IPv6 address in brackets") from None
        if rest:
            if not rest.startswith(":"):
                raise _refuse(text, f"the registry {registry!r} has {rest!r} after its address")
            port = rest[1:]
    else:
        if ":" in registry:
            host, port = registry.rsplit(":", 1)
        if not _HOST.fullmatch(host):
            raise _refuse(text, f"the registry {registry!r} is not a host name or address")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise _refuse(text, f"the registry port {port!r} is not a port number (1 to 65535)")


def parse_oci(text: str, *, for_push: bool = False) -> Reference:
    """`oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, checked against the distribution
    grammar. A pull needs a tag or a digest; a push may name neither (it pushes by digest)."""
    if not text.lower().startswith(OCI_SCHEME):
        raise _refuse(text, "an OCI reference starts with oci://")
    rest = text[len(OCI_SCHEME) :]
    registry, slash, path = rest.partition("/")
    _check_registry(text, registry)
    if not slash or not path:
        raise _refuse(text, "no repository after the registry")
    name, at, digest = path.partition("@")
    tag: str | None = None
    if ":" in name:
        name, tag = name.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise _refuse(text, f"the tag {tag!r} is not a tag (letters, digits, _ . -, at most 128, not "
                                "starting with . or -)")
    if not _REPOSITORY.fullmatch(name):
        raise _refuse(text, f"the repository {name!r} is not a repository name (lowercase letters, digits and "
                            "separators . _ __ -, in parts joined by /)")
    if len(registry) + 1 + len(name) > _MAX_NAME:
        raise _refuse(text, f"the registry and repository are over {_MAX_NAME} characters together")
    if at:
        if not _DIGEST.fullmatch(digest):
            if _ALGORITHM.fullmatch(digest) and not digest.startswith("sha256:"):
                raise _refuse(text, f"the digest {digest!r} is not sha256, the one digest algorithm heddle reads")
            raise _refuse(text, f"the digest {digest!r} is not sha256: and 64 lowercase hex digits")
        if tag is not None:
            raise _refuse(text, f"it names the tag {tag!r} and a digest; give one of them (the digest pins the "
                                "artifact, the tag follows it)")
    elif tag is None and not for_push:
        raise _refuse(text, "it names no tag and no digest (there is no default tag)")
    return Reference(registry, name, tag, digest if at else None)


def parse_url(text: str) -> UrlReference:
    """An `https://` (or `http://`) URL of a bundle, with a host, and nothing heddle would not use."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{text}: not a URL ({exc}); give https://HOST/PATH/app.heddle") from None
    del port  # read only so a bad port is refused here
    if parts.scheme.lower() not in ("https", "http") or not parts.hostname:
        raise UsageError(f"{text}: not a URL with a host; give https://HOST/PATH/app.heddle")
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"{text}: credentials in a URL are not read (they would show in logs and ps); "
                         "serve the file without them, or push it to a registry")
    if parts.fragment:
        raise UsageError(f"{text}: a URL of a bundle has no #fragment; leave it out")
    return UrlReference(text)


def parse_reference(text: str) -> Reference | UrlReference:
    """A reference to pull: an OCI reference or a URL (see `looks_like_reference`)."""
    if text.lower().startswith(OCI_SCHEME):
        return parse_oci(text)
    if text.lower().startswith(URL_SCHEMES):
        return parse_url(text)
    raise UsageError(f"{text}: not a reference; write {FORMS}, or an https:// URL of a .heddle file")
