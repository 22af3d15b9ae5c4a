"""The environment variables that hold heddle's own secrets, named once.

heddle reads them for itself (the server's bearer token and its default model key, the
passphrase of a signing key, the registry credentials). No tool or plugin process gets them, with or without `--safe`:
a tool is the code a bundle brought, and these belong to whoever runs heddle.
This module imports nothing of heddle's at import time, so the server, the bundle code and the
tool runners can all import it.
"""

from __future__ import annotations

from collections.abc import Mapping

AUTH_TOKEN = "HEDDLE_AUTH_TOKEN"
LLM_DEFAULT_KEY = "HEDDLE_LLM_DEFAULT_KEY"
KEY_PASSPHRASE = "HEDDLE_KEY_PASSPHRASE"
# The registry credentials heddle pulls and pushes bundles with (heddle.oci.auth).
REGISTRY_USERNAME = "HEDDLE_REGISTRY_USERNAME"
REGISTRY_PASSWORD = "HEDDLE_REGISTRY_PASSWORD"

# heddle-server's --session-store, which a postgres:// URL's password makes a secret.
SESSION_STORE = "HEDDLE_SESSION_STORE"

SECRET_ENV: frozenset[str] = frozenset({AUTH_TOKEN, LLM_DEFAULT_KEY, KEY_PASSPHRASE, REGISTRY_USERNAME,
                                        REGISTRY_PASSWORD, SESSION_STORE})


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` without heddle's own secrets."""
    return {name: value for name, value in env.items() if name not in SECRET_ENV}


def header_from_env(label: str, header: str, variable: str, environ: Mapping[str, str]) -> str:
    """The value of `header`, which a document writes as `$variable`. Raises UsageError (naming
    `label`, the header and the variable) for heddle's own secret, or a variable unset or empty."""
    from heddle.errors import UsageError

    if variable in SECRET_ENV:
        raise UsageError(f"{label}: header {header!r} names {variable}, heddle's own secret, which no tool or "
                         "server is given; put the value in another variable")
    value = environ.get(variable)
    if not value:
        state = "is not set" if value is None else "is empty"
        raise UsageError(f"{label}: header {header!r} reads environment variable {variable}, which {state}; "
                         f"export {variable} before running")
    return value
