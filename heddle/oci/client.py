"""The part of the OCI distribution API heddle speaks, over httpx: manifests by tag or digest,
blobs (streamed), monolithic blob uploads, manifest pushes, and the registry's challenges
(Basic, or a Bearer token from the realm it names).

Every body is read within a cap on its decoded bytes (heddle.bounded), and each exchange within
its deadline (`--transfer-timeout`), headers and body alike.

Every URL heddle requests, the registry's, a redirect's, a token realm's, is `https`, or plain
`http` to a loopback host or with `--plain-http`: a challenge or a redirect cannot move a pull
onto plain HTTP elsewhere. Credentials go only to the registry's own origin and to its realm;
a redirect to another host (a blob store) gets no Authorization header.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Self

import httpx

from heddle.bounded import ACCEPT_ENCODING, STEP, Body, BodyError, keep_deadline
from heddle.format.errors import MalformedBundleError
from heddle.oci.artifact import ACCEPT, MANIFEST_TYPE, MAX_MANIFEST_BYTES
from heddle.oci.auth import Challenge, Credentials, find_credentials, may_carry_credentials, parse_challenge
from heddle.oci.errors import RegistryError
from heddle.oci.limits import TRANSFER_TIMEOUT_S
from heddle.oci.reference import Reference, is_loopback
from heddle.safeparse import loads_json
from heddle.version import __version__

# How long a registry may stay silent (connecting, or between two reads); the whole exchange is
# bounded by its deadline (TRANSFER_TIMEOUT_S).
TIMEOUT = httpx.Timeout(60.0, connect=15.0)
MAX_REDIRECTS = 5
MAX_ERROR_BYTES = 64 * 1024
MAX_TOKEN_BYTES = 1024 * 1024
CHUNK = 1024 * 1024
PLAIN_HINT = "heddle speaks plain HTTP only to a registry on this machine (loopback), or with --plain-http"
LOGIN_HINT = ("run `docker login {registry}`, or set HEDDLE_REGISTRY_USERNAME and HEDDLE_REGISTRY_PASSWORD with "
              "HEDDLE_REGISTRY={registry}")

Chunks = Callable[[], Iterator[bytes]]


def check_scheme(url: httpx.URL, *, plain_http: bool, what: str) -> None:
    """Refuse a URL heddle may not request: anything but https, and plain http elsewhere than
    loopback without --plain-http."""
    if url.scheme == "https":
        return
    if url.scheme == "http":
        if plain_http or is_loopback(url.host):
            return
        raise RegistryError(f"{what}: {url} is plain HTTP to {url.host}, which is not this machine; {PLAIN_HINT}")
    raise RegistryError(f"{what}: {url} is not an https URL; heddle fetches bundles over https")


def _same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


def _user_agent() -> str:
    return f"heddle/{__version__}"


def read_capped(response: httpx.Response, cap: int, deadline_at: float | None = None,
                deadline_text: str = "") -> bytes | None:
    """The decoded body of a streamed response, or None once it passes `cap` bytes; BodyError
    past `deadline_at` (time.monotonic()) or for an encoding heddle does not decode."""
    out = bytearray()
    body = Body(response, what=str(response.url), cap=cap, cap_text="")
    try:
        for chunk in body.iter_chunks(deadline_at, deadline_text):
            out += chunk
    except BodyError:
        if body.over:
            return None
        raise
    return bytes(out)


def _said(response: httpx.Response) -> str:
    """What a registry's error body says ({"errors": [{"code", "message"}]}), briefly."""
    try:
        body = read_capped(response, MAX_ERROR_BYTES) or b""
    except (httpx.HTTPError, BodyError):
        body = b""
    try:
        data = loads_json(body) if body else None
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("errors"), list) and data["errors"]:
        first = data["errors"][0]
        if isinstance(first, dict):
            parts = [str(first.get(k)) for k in ("code", "message") if first.get(k)]
            if parts:
                return ": ".join(parts)[:300]
    return f"HTTP {response.status_code} {response.reason_phrase}".strip()


class Session:
    """An httpx client that follows redirects itself, holding every hop to the scheme rule."""

    def __init__(self, *, plain_http: bool, what: str, transport: httpx.BaseTransport | None = None,
                 deadline: float | None = TRANSFER_TIMEOUT_S) -> None:
        self.plain_http = plain_http
        self.what = what
        # The whole exchange ends by then, however slowly the registry answers (headers too).
        self.deadline = deadline
        self.deadline_at = None if deadline is None else time.monotonic() + deadline
        self._http = httpx.Client(timeout=TIMEOUT, follow_redirects=False, transport=transport,
                                  headers={"User-Agent": _user_agent(), "Accept-Encoding": ACCEPT_ENCODING})
        keep_deadline(self._http, lambda: self.deadline_at)
        # The origin Authorization is sent to, and what it is.
        self._origin: httpx.URL | None = None
        self._authorization: str | None = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def send(self, method: str, url: httpx.URL | str, *, headers: Mapping[str, str] | None = None,
             content: Chunks | bytes | None = None, stream: bool = False,
             extra_auth: tuple[httpx.URL, str] | None = None) -> httpx.Response:
        """One request, following GET and HEAD redirects (each hop checked); transport failures
        become one RegistryError naming the host. The response is always streamed (`stream` is kept
        for callers): its body is read only within a cap, and the caller closes it."""
        target = httpx.URL(url)
        for _hop in range(MAX_REDIRECTS + 1):
            check_scheme(target, plain_http=self.plain_http, what=self.what)
            self.check_deadline()
            sent = dict(headers or {})
            for origin, value in ((self._origin, self._authorization), extra_auth or (None, None)):
                if origin is not None and value is not None and _same_origin(target, origin):
                    sent["Authorization"] = value
            body = content() if callable(content) else content
            request = self._http.build_request(method, target, headers=sent, content=body)
            try:
                # Always streamed: a body is read only within a cap (read_capped, stream_to).
                response = self._http.send(request, stream=True)
            except httpx.InvalidURL:
                # httpx reads a redirect's Location as it answers, even one it will not follow.
                raise RegistryError(f"{self.what}: {target.host} redirected to a Location that is not a URL; heddle "
                                    "follows redirects to https URLs only") from None
            except httpx.HTTPError as exc:
                self.check_deadline()
                raise RegistryError(f"{self.what}: cannot reach {target.host}: {exc or type(exc).__name__}") from None
            if not (response.is_redirect and method in ("GET", "HEAD")):
                return response
            location = response.headers.get("location")
            response.close()
            if not location:
                raise RegistryError(f"{self.what}: {target.host} answered a redirect without a Location")
            try:
                target = target.join(location)
            except httpx.InvalidURL:
                raise RegistryError(f"{self.what}: {target.host} redirected to {location[:200]!r}, which is not a "
                                    "URL; heddle follows redirects to https URLs only") from None
        raise RegistryError(f"{self.what}: more than {MAX_REDIRECTS} redirects from {httpx.URL(url).host}")

    def deadline_text(self) -> str:
        return f"{self.deadline:g} s (--transfer-timeout)"

    def check_deadline(self) -> None:
        """RegistryError once the exchange's deadline has passed."""
        if self.deadline_at is not None and time.monotonic() >= self.deadline_at:
            raise RegistryError(f"{self.what}: the transfer did not finish within {self.deadline_text()}")

    def stream_to(self, response: httpx.Response, write: Callable[[bytes], None], *, cap: int) -> None:
        """Hand the decoded body of a streamed response to `write`, chunk by chunk, within the
        deadline. `write` refuses a byte past `cap` with its own error (a layer longer than its
        manifest says, a file over the caps); the body is decoded a step at a time and never more
        than one step past `cap`, so that error is the one raised."""
        body = Body(response, what=self.what, cap=cap + STEP, cap_text="the size its manifest or the caps allow")
        try:
            for chunk in body.iter_chunks(self.deadline_at, self.deadline_text()):
                write(chunk)
        except BodyError as exc:
            raise RegistryError(exc.message) from None
        except httpx.HTTPError as exc:
            self.check_deadline()
            raise RegistryError(f"{self.what}: the download from {response.url.host} broke off: {exc}") from None


class Registry(Session):
    """One repository of one registry: `pull` scope, or `pull,push` for a push. Credentials are
    looked up the first time the registry asks for them."""

    def __init__(self, ref: Reference, *, plain_http: bool = False, push: bool = False,
                 environ: Mapping[str, str] | None = None, transport: httpx.BaseTransport | None = None,
                 deadline: float | None = TRANSFER_TIMEOUT_S) -> None:
        super().__init__(plain_http=plain_http, what=str(ref), transport=transport, deadline=deadline)
        self.ref = ref
        scheme = "http" if plain_http or ref.loopback else "https"
        self.origin = httpx.URL(f"{scheme}://{ref.endpoint}/")
        self.base = f"{scheme}://{ref.endpoint}/v2/{ref.repository}"
        self.scope = f"repository:{ref.repository}:{'pull,push' if push else 'pull'}"
        self._environ = os.environ if environ is None else environ
        self._credentials: Credentials | None = None
        self._looked = False  # credentials are looked up once, at the first challenge

    # -------------------------------------------------------------- auth

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                content: Chunks | bytes | None = None, stream: bool = False) -> httpx.Response:
        """`send`, answering one challenge (401) with credentials and trying once more."""
        response = self.send(method, url, headers=headers, content=content, stream=stream)
        if response.status_code != 401:
            return response
        response.close()
        if not _same_origin(response.url, self.origin):
            # A host a redirect led to: whatever it asks, the registry's credentials are not its.
            raise RegistryError(f"{self.ref}: {response.url.host}, where {self.ref.registry} redirected heddle, asks "
                                f"for credentials; heddle sends {self.ref.registry}'s to {self.ref.registry} alone")
        challenge = parse_challenge(response.headers.get("www-authenticate", ""))
        # Asked again (a token that expired, a wider scope): a fresh answer, once.
        self._authorize(challenge)
        response = self.send(method, url, headers=headers, content=content, stream=stream)
        if response.status_code == 401:
            response.close()
            raise self._refused()
        return response

    def _refused(self) -> RegistryError:
        registry = self.ref.registry
        if self._credentials is None:
            return RegistryError(f"{self.ref}: {registry} asks for credentials and none were found; "
                                 + LOGIN_HINT.format(registry=registry))
        return RegistryError(f"{self.ref}: {registry} refused the credentials from {self._credentials.source}; "
                             + LOGIN_HINT.format(registry=registry))

    def _authorize(self, challenge: Challenge | None) -> None:
        registry = self.ref.registry
        if challenge is None:
            raise RegistryError(f"{self.ref}: {registry} answered 401 without a WWW-Authenticate challenge")
        if not self._looked:
            self._credentials = find_credentials(registry, self._environ)
            self._looked = True
        creds = self._credentials
        if challenge.scheme == "basic":
            if creds is None:
                raise self._refused()
            if creds.username is None or creds.password is None:
                raise RegistryError(f"{self.ref}: {registry} asks for a user and password; the credentials from "
                                    f"{creds.source} hold a token")
            self._set(f"Basic {_basic(creds.username, creds.password)}")
        elif challenge.scheme == "bearer":
            if creds is not None and creds.registry_token is not None:
                self._set(f"Bearer {creds.registry_token}")
            else:
                self._set(f"Bearer {self._token(challenge, creds)}")
        else:
            raise RegistryError(f"{self.ref}: {registry} asks for {challenge.scheme!r} authentication; heddle "
                                "answers Basic and Bearer challenges")

    def _set(self, authorization: str) -> None:
        self._origin, self._authorization = self.origin, authorization

    def _token(self, challenge: Challenge, creds: Credentials | None) -> str:
        realm = challenge.params.get("realm")
        if not realm:
            raise RegistryError(f"{self.ref}: {self.ref.registry}'s Bearer challenge names no realm")
        try:
            realm_url = httpx.URL(realm)
        except httpx.InvalidURL:
            raise RegistryError(f"{self.ref}: {self.ref.registry}'s Bearer challenge names the realm {realm[:200]!r}, "
                                "which is not a URL") from None
        service = challenge.params.get("service")
        fields = {"scope": self.scope, **({"service": service} if service else {})}
        # Checked before credentials go anywhere: the realm is a URL the registry chose.
        check_scheme(realm_url, plain_http=self.plain_http, what=f"{self.ref} (token realm)")
        if creds is not None and not may_carry_credentials(self.origin.host, realm_url.scheme, realm_url.host):
            raise RegistryError(f"{self.ref}: {self.ref.registry}'s token service {realm_url.host} is plain HTTP on "
                                "another host; heddle sends credentials to a token service over https, or on the "
                                "registry's own host")
        if creds is not None and creds.identity_token is not None:
            form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token, "client_id": "heddle",
                    **fields}
            response = self.send("POST", realm_url, content=str(httpx.QueryParams(form)).encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"}, stream=True)
        else:
            auth = None
            if creds is not None and creds.username is not None and creds.password is not None:
                auth = (realm_url, f"Basic {_basic(creds.username, creds.password)}")
            response = self.send("GET", realm_url.copy_merge_params(fields), stream=True, extra_auth=auth)
        try:
            if response.status_code in (401, 403):
                raise self._refused()
            if response.status_code != 200:
                raise RegistryError(f"{self.ref}: the token service {realm_url.host} answered {_said(response)}")
            body = self._read(response, MAX_TOKEN_BYTES, "the token")
        finally:
            response.close()
        try:
            data: Any = loads_json(body) if body else None
        except ValueError:
            data = None
        token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.ref}: the token service {realm_url.host} answered no token")
        return token

    # -------------------------------------------------------------- the API

    def _read(self, response: httpx.Response, cap: int, what: str) -> bytes | None:
        """A small body (a manifest, a token) within `cap` decoded bytes and the deadline; None over the cap."""
        try:
            return read_capped(response, cap, self.deadline_at, self.deadline_text())
        except BodyError as exc:
            self.check_deadline()
            raise RegistryError(f"{self.ref}: reading {what}: {exc.message}") from None
        except httpx.HTTPError as exc:
            self.check_deadline()
            raise RegistryError(f"{self.ref}: reading {what} broke off: {exc}") from None

    def _fail(self, response: httpx.Response, doing: str) -> RegistryError:
        said = _said(response)
        response.close()
        status = response.status_code
        if status == 404:
            return RegistryError(f"{self.ref}: {doing}: not found in {self.ref.registry} ({said})")
        if status == 403:
            return RegistryError(f"{self.ref}: {doing}: denied by {self.ref.registry} ({said}); the credentials "
                                 f"may not do this, " + LOGIN_HINT.format(registry=self.ref.registry))
        return RegistryError(f"{self.ref}: {doing}: {self.ref.registry} answered {said}")

    def get_manifest(self, target: str) -> tuple[bytes, str | None, str | None]:
        """(bytes, Content-Type, Docker-Content-Digest) of the manifest a tag or digest names."""
        what = "digest" if target.startswith("sha256:") else "tag"
        response = self.request("GET", f"{self.base}/manifests/{target}", headers={"Accept": ACCEPT}, stream=True)
        if response.status_code != 200:
            raise self._fail(response, f"reading the manifest of {what} {target}")
        try:
            raw = self._read(response, MAX_MANIFEST_BYTES, "the manifest")
        finally:
            response.close()
        if raw is None:
            raise MalformedBundleError(f"{self.ref}: the OCI manifest is over {MAX_MANIFEST_BYTES} bytes")
        return raw, response.headers.get("content-type"), response.headers.get("docker-content-digest")

    def has_blob(self, digest: str, size: int) -> bool:
        response = self.request("HEAD", f"{self.base}/blobs/{digest}")
        response.close()
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            raise self._fail(response, f"checking for blob {digest}")
        length = response.headers.get("content-length")
        return length is None or length == str(size)

    @contextmanager
    def blob(self, digest: str) -> Iterator[httpx.Response]:
        """The streamed response of a blob; the caller checks what it reads against `digest`."""
        # A bundle is zstd already: its bytes are wanted exactly as stored.
        response = self.request("GET", f"{self.base}/blobs/{digest}", headers={"Accept-Encoding": "identity"},
                                stream=True)
        try:
            if response.status_code != 200:
                raise self._fail(response, f"downloading blob {digest}")
            yield response
        finally:
            response.close()

    def upload_blob(self, digest: str, size: int, content: Chunks | bytes) -> None:
        """Upload a blob in one PUT (the monolithic upload every registry takes)."""
        started = self.request("POST", f"{self.base}/blobs/uploads/", headers={"Content-Length": "0"})
        if started.status_code != 202 or not started.headers.get("location"):
            raise self._fail(started, f"starting the upload of blob {digest}")
        started.close()
        location = started.url.join(started.headers["location"]).copy_merge_params({"digest": digest})
        done = self.request("PUT", str(location), content=content,
                            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        if done.status_code != 201:
            raise self._fail(done, f"uploading blob {digest}")
        done.close()

    def put_manifest(self, target: str, raw: bytes) -> str | None:
        """Push the manifest under a tag or its digest; the digest the registry says it stored."""
        response = self.request("PUT", f"{self.base}/manifests/{target}", content=raw,
                                headers={"Content-Type": MANIFEST_TYPE})
        if response.status_code != 201:
            raise self._fail(response, f"pushing the manifest as {target}")
        response.close()
        stored: str | None = response.headers.get("docker-content-digest")
        return stored


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
