"""The registries tests/support/registry.py starts, for this folder's tests (module scope each)."""

from __future__ import annotations

from tests.support.registry import auth_registry, registry  # noqa: F401
