"""Registry credentials, looked up only when a registry asks for them, as docker, oras and cosign
look them up: `HEDDLE_REGISTRY_USERNAME`/`HEDDLE_REGISTRY_PASSWORD` first (for the one registry
`HEDDLE_REGISTRY` names, and no other), then the docker config (`$DOCKER_CONFIG/config.json`,
else `~/.docker/config.json`): its `credHelpers` for the registry, its `credsStore`, then its
`auths` entry (`auth` is base64 `user:password`; `username`/`password`; `identitytoken`, a
refresh token for the registry's token service; `registrytoken`, a bearer token sent as it is).

A credential helper is a program (`docker-credential-NAME get`) given the registry on stdin;
it is started without heddle's own secrets in its environment.

Where credentials go (heddle.oci.client attaches them): to the registry they are for, and to
the token service its own challenge names, when that is https or on the registry's own host.
A challenge that comes from elsewhere (a host a redirect led to) gets none.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from heddle import secret_env
from heddle.oci.errors import RegistryError
from heddle.safeparse import ParseLimitError, loads_json, read_regular

USERNAME_ENV = secret_env.REGISTRY_USERNAME
PASSWORD_ENV = secret_env.REGISTRY_PASSWORD
# The registry (host[:port], as a reference writes it) the two variables above are for: without
# it they are sent nowhere, since a bundle's reference, a tag followed or a redirect may name any.
REGISTRY_ENV = "HEDDLE_REGISTRY"
_HOST_PORT = re.compile(r"(?:[a-z0-9]([a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])"
                        r"(?::[0-9]{1,5})?")
MAX_CONFIG_BYTES = 4 * 1024 * 1024
HELPER_TIMEOUT = 60.0
# What a helper answers as the user name when its secret is an identity token.
_TOKEN_USER = "<token>"
# The names Docker Hub's credentials are kept under.
_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/")


@dataclass(frozen=True)
class Credentials:
    """What a registry is answered with: a user and password, an identity (refresh) token, or a
    bearer token to send as it is. `source` says where they came from, for messages."""

    source: str
    username: str | None = None
    password: str | None = None
    identity_token: str | None = None
    registry_token: str | None = None


def docker_config_path(environ: Mapping[str, str]) -> Path:
    folder = environ.get("DOCKER_CONFIG")
    if folder:
        return Path(folder) / "config.json"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".docker" / "config.json"


def _server_key(text: str) -> str:
    """An `auths` key as the registry host[:port] it names (keys may be written as URLs)."""
    bare = re.sub(r"^[a-z]+://", "", text.strip().lower())
    return bare.split("/", 1)[0]


def _keys(registry: str) -> tuple[str, ...]:
    lowered = registry.lower()
    return _HUB_KEYS if lowered in _HUB_KEYS else (lowered,)


def same_registry(a: str, b: str) -> bool:
    """Whether two registries written as host[:port] are one (Docker Hub's names are one)."""
    return set(_keys(a.strip())) == set(_keys(b.strip()))


def _from_env(registry: str, environ: Mapping[str, str]) -> Credentials | None:
    user, password = environ.get(USERNAME_ENV), environ.get(PASSWORD_ENV)
    if not user and not password:
        return None
    if not user or not password:
        missing, given = (USERNAME_ENV, PASSWORD_ENV) if not user else (PASSWORD_ENV, USERNAME_ENV)
        raise RegistryError(f"{given} is set but {missing} is not; set both, or neither to use the docker config")
    configured = (environ.get(REGISTRY_ENV) or "").strip()
    if not configured:
        raise RegistryError(f"{registry} asks for credentials, and {USERNAME_ENV}/{PASSWORD_ENV} are set but "
                            f"{REGISTRY_ENV} is not; set {REGISTRY_ENV} to the registry they are for "
                            f"(e.g. {REGISTRY_ENV}={registry}): heddle sends them to that registry alone")
    if not _HOST_PORT.fullmatch(configured.lower()):
        raise RegistryError(f"{REGISTRY_ENV}={configured!r} is not a registry's host[:port] (as an oci:// reference "
                            "writes it, without scheme or path)")
    if not same_registry(configured, registry):
        return None  # another registry's: this one gets the docker config's, if any
    return Credentials(f"{USERNAME_ENV}/{PASSWORD_ENV}", username=user, password=password)


def may_carry_credentials(registry_host: str, scheme: str, host: str) -> bool:
    """Whether a token service at scheme://host, named by the challenge of the registry on
    `registry_host`, may be sent its credentials: over https, or on the registry's own host
    (where the scheme rule allowed plain HTTP to the registry itself)."""
    return scheme == "https" or host.lower() == registry_host.lower()


def _read_config(path: Path) -> dict[str, object] | None:
    try:
        data = read_regular(path, max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except ParseLimitError as exc:
        raise RegistryError(f"{path} {exc}") from None
    except OSError as exc:
        raise RegistryError(f"{path}: cannot be read ({exc.strerror or exc}); fix it or set DOCKER_CONFIG") from None
    try:
        config = loads_json(data)
    except ValueError as exc:
        raise RegistryError(f"{path}: not JSON ({exc}); fix it or set DOCKER_CONFIG to another folder") from None
    if not isinstance(config, dict):
        raise RegistryError(f"{path}: not a JSON object; fix it or set DOCKER_CONFIG to another folder")
    return config


def _text_field(entry: Mapping[str, object], name: str, where: str) -> str | None:
    value = entry.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RegistryError(f"{where}: {name} is not a string")
    return value


def _from_entry(entry: object, where: str) -> Credentials | None:
    if not isinstance(entry, dict):
        raise RegistryError(f"{where}: not an object")
    identity = _text_field(entry, "identitytoken", where)
    registry_token = _text_field(entry, "registrytoken", where)
    user, password = _text_field(entry, "username", where), _text_field(entry, "password", where)
    encoded = _text_field(entry, "auth", where)
    if encoded is not None:
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise RegistryError(f"{where}: auth is not base64 of user:password; log in again (docker login)") from None
        if ":" not in decoded:
            raise RegistryError(f"{where}: auth is not base64 of user:password; log in again (docker login)")
        user, password = decoded.split(":", 1)
    if identity is not None:
        return Credentials(where, username=user, identity_token=identity)
    if registry_token is not None:
        return Credentials(where, registry_token=registry_token)
    if user is None and password is None:
        return None  # an empty entry: docker leaves one where a credential store keeps the secret
    if not user or password is None:
        raise RegistryError(f"{where}: a user name without a password (or the other way round); log in again")
    return Credentials(where, username=user, password=password)


def _from_helper(name: str, registry: str, where: str, environ: Mapping[str, str]) -> Credentials | None:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise RegistryError(f"{where}: {name!r} is not a credential helper's name")
    program = shutil.which(f"docker-credential-{name}", path=environ.get("PATH"))
    if program is None:
        raise RegistryError(f"{where} names the credential helper {name!r}, but docker-credential-{name} is not on "
                            "PATH; install it, or set HEDDLE_REGISTRY_USERNAME and HEDDLE_REGISTRY_PASSWORD")
    try:
        done = subprocess.run([program, "get"], input=registry, capture_output=True, text=True,
                              timeout=HELPER_TIMEOUT, env=secret_env.without_secrets(environ), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RegistryError(f"credential helper docker-credential-{name} for {registry} failed: {exc}") from None
    if done.returncode != 0:
        if "credentials not found" in (done.stdout + done.stderr).lower():
            return None
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no message"]
        raise RegistryError(f"credential helper docker-credential-{name} for {registry} exited {done.returncode}: "
                            f"{said[0]}")
    try:
        answer = loads_json(done.stdout)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("Secret"), str):
        raise RegistryError(f"credential helper docker-credential-{name} for {registry} did not answer "
                            '{"Username": ..., "Secret": ...}')
    user, secret = answer.get("Username"), answer["Secret"]
    source = f"docker-credential-{name}"
    if user == _TOKEN_USER:
        return Credentials(source, identity_token=secret)
    if not isinstance(user, str) or not user:
        raise RegistryError(f"credential helper docker-credential-{name} for {registry} answered no Username")
    return Credentials(source, username=user, password=secret)


def find_credentials(registry: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """The credentials for `registry` (host[:port] as the reference writes it), or None."""
    environ = os.environ if environ is None else environ
    found = _from_env(registry, environ)
    if found is not None:
        return found
    path = docker_config_path(environ)
    config = _read_config(path)
    if config is None:
        return None
    keys = _keys(registry)
    helpers = config.get("credHelpers") or {}
    if not isinstance(helpers, dict):
        raise RegistryError(f"{path}: credHelpers is not an object")
    for key in keys:
        if key in helpers:
            helper = helpers[key]
            if not isinstance(helper, str):
                raise RegistryError(f"{path}: credHelpers[{key!r}] is not a helper's name")
            return _from_helper(helper, registry, f"{path} credHelpers[{key!r}]", environ)
    auths = config.get("auths") or {}
    if not isinstance(auths, dict):
        raise RegistryError(f"{path}: auths is not an object")
    entry = next((value for name, value in auths.items() if _server_key(str(name)) in {_server_key(k) for k in keys}),
                 None)
    store = config.get("credsStore")
    if store:
        if not isinstance(store, str):
            raise RegistryError(f"{path}: credsStore is not a helper's name")
        stored = _from_helper(store, registry, f"{path} credsStore", environ)
        if stored is not None:
            return stored
    if entry is None:
        return None
    return _from_entry(entry, f"{path} auths[{registry!r}]")


@dataclass(frozen=True)
class Challenge:
    """A WWW-Authenticate challenge: its scheme (lowercase) and parameters."""

    scheme: str
    params: Mapping[str, str]


_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


def parse_challenge(header: str) -> Challenge | None:
    """The first challenge of a WWW-Authenticate header, or None when there is none."""
    match = re.match(r"\s*([A-Za-z][A-Za-z0-9_-]*)(?:\s+|$)", header)
    if match is None:
        return None
    params: dict[str, str] = {}
    rest = header[match.end():]
    for found in _PARAM.finditer(rest):
        quoted, plain = found.group(2), found.group(3)
        params[found.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else plain
    return Challenge(match.group(1).lower(), params)
