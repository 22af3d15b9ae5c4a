"""The environment variables that hold heddle's own secrets, named once.

heddle reads them for itself (the server's bearer token and its default model key, the
passphrase of a signing key, the registry credentials, the session store and its key). No tool or plugin
process gets them, with or without `--safe`, and no document reads them as `$NAME` (heddle.agentspec.env_reads):
a tool is the code a bundle brought, a document names the hosts it talks to, and these belong to whoever
runs heddle.
This module imports nothing of heddle's at import time, so the server, the bundle code and the
tool runners can all import it.
"""

from __future__ import annotations

from collections.abc import Mapping

from heddle.errors import UsageError

AUTH_TOKEN = "HEDDLE_AUTH_TOKEN"
LLM_DEFAULT_KEY = "HEDDLE_LLM_DEFAULT_KEY"
KEY_PASSPHRASE = "HEDDLE_KEY_PASSPHRASE"
# The registry credentials heddle pulls and pushes bundles with (heddle.oci.auth).
REGISTRY_USERNAME = "HEDDLE_REGISTRY_USERNAME"
REGISTRY_PASSWORD = "HEDDLE_REGISTRY_PASSWORD"

# heddle-server's --session-store, which a postgres:// URL's password makes a secret.
SESSION_STORE = "HEDDLE_SESSION_STORE"
# The key session records are authenticated with.
SESSION_KEY = "HEDDLE_SESSION_KEY"

SECRET_ENV: frozenset[str] = frozenset({AUTH_TOKEN, LLM_DEFAULT_KEY, KEY_PASSPHRASE, REGISTRY_USERNAME,
                                        REGISTRY_PASSWORD, SESSION_STORE, SESSION_KEY})


def is_secret(name: str) -> bool:
    """Whether the environment variable `name` holds one of heddle's own secrets: the one rule by
    which a tool's environment is cut and a document's `$NAME` is refused."""
    return name in SECRET_ENV


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` without heddle's own secrets."""
    return {name: value for name, value in env.items() if not is_secret(name)}


def secret_read(field: str, variable: str) -> str:
    """The refusal of a document's `field` that reads heddle's own secret `variable`, for the
    caller to put where it happened in front of."""
    return (f"{field} reads ${variable}, heddle's own secret, which no document may read (it would go to the "
            "host the document names); put the value in a variable of its own")


def header_from_env(label: str, header: str, variable: str, environ: Mapping[str, str]) -> str:
    """The value of `header`, which a document writes as `$variable`. Raises UsageError (naming
    `label`, the header and the variable) for heddle's own secret, or a variable unset or empty."""
    if is_secret(variable):
        raise UsageError(f"{label}: {secret_read(f'header {header!r}', variable)}")
    value = environ.get(variable)
    if not value:
        state = "is not set" if value is None else "is empty"
        raise UsageError(f"{label}: header {header!r} reads environment variable {variable}, which {state}; "
                         f"export {variable} before running")
    return value
