"""The environment variables that hold heddle's own secrets, named once.

heddle reads them for itself (the server's bearer token and its default model key, the
passphrase of a signing key). No tool or plugin process gets them, with or without `--safe`:
a tool is the code a bundle brought, and these belong to whoever runs heddle.
This module imports nothing of heddle's, so the server, the bundle code and the tool
runners can all import it.
"""

from __future__ import annotations

from collections.abc import Mapping

AUTH_TOKEN = "HEDDLE_AUTH_TOKEN"
LLM_DEFAULT_KEY = "HEDDLE_LLM_DEFAULT_KEY"
KEY_PASSPHRASE = "HEDDLE_KEY_PASSPHRASE"

SECRET_ENV: frozenset[str] = frozenset({AUTH_TOKEN, LLM_DEFAULT_KEY, KEY_PASSPHRASE})


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` without heddle's own secrets."""
    return {name: value for name, value in env.items() if name not in SECRET_ENV}
